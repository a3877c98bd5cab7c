package console

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/millrace/millrace/internal/redact"
)

// shown is a payload as a page shows it.
type shown struct {
	Text   string
	Hidden bool
}

// show is what r's identity is shown of payload, the payload of res:
// Config.Redact's choice, or by default the payload whole to an identity
// that may "read-payload" res, else its values redacted (a payload that
// is not JSON hidden). Nothing else of it reaches the page.
func (c *Console) show(r *http.Request, res Resource, payload []byte) shown {
	res = c.resource(res)
	var out []byte
	switch {
	case c.cfg.Redact != nil:
		out = c.cfg.Redact(identity(r), res, payload)
	case c.authorized(r, "read-payload", res) == nil:
		out = payload
	default:
		out, _ = redact.JSON(payload)
	}
	if out == nil {
		return shown{Hidden: true}
	}
	if json.Valid(out) {
		return shown{Text: indent(out)}
	}
	return shown{Text: strings.ToValidUTF8(string(out), "\uFFFD")}
}
