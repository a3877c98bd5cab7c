package sagatest

import (
	"errors"
	"fmt"

	"github.com/millrace/millrace/saga"
)

// Pause pauses the saga of the event (Orchestrator.Pause) just before the
// event is handled, and resumes it after Fault.Times timer firings, or
// once nothing else can move: the event (a reply, say) arrives while the
// saga is paused. A saga that is not running or compensating by then is
// left alone. It is not in AllFaults: name it in a Script, or in
// RandomOptions.Kinds.
const Pause FaultKind = "pause"

// PauseFor returns a Pause fault at the events at names, resumed after n
// timer firings.
func PauseFor(n int, at Event) Fault { return Fault{Kind: Pause, At: at, Times: n} }

// pauser is the actor of the harness's pauses and resumes.
var pauser = saga.Actor{Operator: "sagatest", Reason: "a planned pause"}

// pausedSaga is a saga the harness paused, and the timer firings left
// before it resumes it.
type pausedSaga struct {
	id   string
	hold int
}

// pause pauses saga id for f.Times timer firings.
func (h *H) pause(id string, f Fault) error {
	_, err := h.o.Pause(h.ctx, id, pauser)
	if errors.Is(err, saga.ErrActionNotAllowed) {
		h.logf("PAUSE %s: not running (%v)", id, err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("sagatest: pause %s: %w", id, err)
	}
	h.logf("PAUSE %s for %d timer firings", id, max(f.Times, 1))
	h.paused = append(h.paused, &pausedSaga{id: id, hold: max(f.Times, 1)})
	return nil
}

// resumePaused resumes the sagas whose pause has lasted its timer
// firings (all of them if all is set: nothing else can move).
func (h *H) resumePaused(all bool) error {
	kept := h.paused[:0]
	for _, p := range h.paused {
		if p.hold--; p.hold > 0 && !all {
			kept = append(kept, p)
			continue
		}
		h.logf("RESUME %s", p.id)
		if _, err := h.o.Resume(h.ctx, p.id, pauser); err != nil {
			return fmt.Errorf("sagatest: resume %s: %w", p.id, err)
		}
	}
	h.paused = kept
	return nil
}
