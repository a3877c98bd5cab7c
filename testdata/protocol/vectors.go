// Package protocol holds the saga wire protocol's test vectors
// (docs/protocol.md, "Conformance") as files: cases/*.json, one case of a
// participant's rules each, idempotency_keys.json and outbox.json. The conformance kit
// (internal/conform) and the Go participant's tests read them from FS;
// participants in other languages read the files.
package protocol

import "embed"

// FS holds cases/*.json, idempotency_keys.json and outbox.json.
//
//go:embed cases/*.json idempotency_keys.json outbox.json
var FS embed.FS
