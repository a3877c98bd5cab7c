package millrace_test

import (
	"errors"
	"fmt"

	"github.com/millrace/millrace"
)

// Example_batchError shows how a publisher reports which messages of a
// batch failed, and how a caller tells a message at fault from a passing
// outage.
func Example_batchError() {
	tooLarge := errors.New("message too large")
	err := error(&millrace.BatchError{Errors: []millrace.MessageError{
		{UUID: "0190b7e2-5f00-7000-8000-000000000001", Err: millrace.Permanent(tooLarge)},
		{UUID: "0190b7e2-5f00-7000-8000-000000000002", Err: errors.New("broker unavailable")},
	}})

	var be *millrace.BatchError
	if errors.As(err, &be) {
		for _, me := range be.Errors {
			fmt.Printf("%s permanent=%v: %v\n", me.UUID, millrace.IsPermanent(me.Err), me.Err)
		}
	}
	fmt.Println("any permanent:", millrace.IsPermanent(err), "wraps tooLarge:", errors.Is(err, tooLarge))
	// Output:
	// 0190b7e2-5f00-7000-8000-000000000001 permanent=true: message too large
	// 0190b7e2-5f00-7000-8000-000000000002 permanent=false: broker unavailable
	// any permanent: true wraps tooLarge: true
}
