package core_test

import (
	"errors"
	"fmt"

	"github.com/millrace/millrace/core"
)

// Example_batchError shows how a publisher reports which messages of a
// batch failed, and how a caller tells a message at fault from a passing
// outage.
func Example_batchError() {
	tooLarge := errors.New("message too large")
	err := error(&core.BatchError{Errors: []core.MessageError{
		{UUID: "0190b7e2-5f00-7000-8000-000000000001", Err: core.Permanent(tooLarge)},
		{UUID: "0190b7e2-5f00-7000-8000-000000000002", Err: errors.New("broker unavailable")},
	}})

	var be *core.BatchError
	if errors.As(err, &be) {
		for _, me := range be.Errors {
			fmt.Printf("%s permanent=%v: %v\n", me.UUID, core.IsPermanent(me.Err), me.Err)
		}
	}
	fmt.Println("any permanent:", core.IsPermanent(err), "wraps tooLarge:", errors.Is(err, tooLarge))
	// Output:
	// 0190b7e2-5f00-7000-8000-000000000001 permanent=true: message too large
	// 0190b7e2-5f00-7000-8000-000000000002 permanent=false: broker unavailable
	// any permanent: true wraps tooLarge: true
}
