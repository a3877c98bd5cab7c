package saga

import (
	"encoding/json"
	"fmt"
)

// Conditional steps (Step.When).

// skippedByCondition is the outcome of the "skipped" history line of a
// step whose condition was false (an operator's skip has none).
const skippedByCondition = "condition"

func eraseWhen[D any](fn func(D) bool) func(data []byte) (bool, error) {
	return func(data []byte) (run bool, err error) {
		defer recoverInto(&err)
		var d D
		if err := json.Unmarshal(data, &d); err != nil {
			return false, fmt.Errorf("saga: decode data: %w", err)
		}
		return fn(d), nil
	}
}

// tryIf runs a try of s (see try) unless its condition is false: then s
// is skipped and done. The condition is evaluated when the saga reaches s,
// not again for its later tries (its first may have taken effect). A
// condition that cannot be evaluated (it panics,
// the data does not decode) parks the saga as stuck at s: an operator's
// Retry evaluates it again.
func (m *machine) tryIf(s *stepDef) (done bool, err error) {
	st := m.in.state(s.name)
	if s.when == nil || st.Status != StepPending {
		return m.try(s)
	}
	run, err := s.when(m.in.Data)
	if err != nil {
		return false, m.stuck(fmt.Sprintf("step %s: its condition: %v", s.name, err))
	}
	if run {
		return m.try(s)
	}
	st.Status, st.Due, st.Reason = StepSkipped, nil, "its condition is false"
	m.record("skipped", s.name, "", 0, skippedByCondition, st.Reason)
	return true, nil
}
