// Command millrace operates millrace's tables from a shell: migrations, the
// outbox backlog and its dead letters, replay, the inboxes' dead letters,
// and the web console.
//
//	millrace migrate up
//	millrace outbox stats
//	millrace outbox dead list --topic orders
//	millrace outbox dead requeue 0192f5c4-... --reason "topic created"
//	millrace inbox dead list --consumer billing --json
//	millrace saga list --status stuck --older-than 1h
//	millrace saga show order-1234
//	millrace saga retry order-1234 --reason "stock service fixed"
//	millrace audit list --since 24h
//	millrace console
//
// The database comes from --database-url or DATABASE_URL, the schema from
// --schema (default millrace). Output is an aligned table for people;
// --json prints JSON for scripts. The exit status is 0 on success, 1 when a
// command fails, 2 for a usage error; an error is one line on stderr, and a
// command that fails changes nothing. "millrace help logging" tells how to
// route millrace's logs through log/slog.
//
// Every action takes a reason (--reason, asked for on a terminal) and the
// operator (--operator, default $USER), recorded in the audit trail.
//
// The saga actions (retry, skip, mark-compensated, abort, pause, resume)
// run a saga's next step, the Go code of its definition, which this stock
// binary does not have: it records an operator request that the service's
// running orchestrator applies. A service builds its own binary with its
// definitions, in a few lines, with package
// github.com/millrace/millrace/cmd/millrace/cli (cli.Config.Sagas).
package main

import (
	"os"

	"github.com/millrace/millrace/cmd/millrace/cli"
)

func main() { os.Exit(cli.Main(cli.Config{})) }
