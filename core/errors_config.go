package core

import "errors"

// ErrConfig is the one sentinel every millrace constructor wraps when it
// refuses a configuration: a nil pool, a missing required field, a value out
// of range. Test for it with errors.Is(err, core.ErrConfig); the message
// says which field and why.
var ErrConfig = errors.New("millrace: invalid config")
