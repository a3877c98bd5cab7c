package cli_test

import (
	"os"

	"github.com/millrace/millrace/cmd/millrace/cli"
	"github.com/millrace/millrace/saga"
)

type order struct {
	ID string `json:"id"`
}

// A service's own operator binary (say cmd/orders-ops/main.go in its
// repository): the millrace command with the service's saga definitions
// registered, so that "saga retry", "skip", "mark-compensated" and "abort"
// can run the sagas' next steps.
func Example() {
	checkout, err := saga.Define(saga.Spec[order]{
		Type: "checkout", Version: 1,
		Steps: []saga.Step[order]{
			{Name: "reserve", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "stock.commands"}, Compensation: &saga.Command[order]{}},
			{Name: "charge", Kind: saga.Pivot, Action: &saga.Command[order]{Topic: "payments.commands"}},
		},
	})
	if err != nil {
		panic(err)
	}
	os.Exit(cli.Main(cli.Config{
		Sagas: func(o *saga.Orchestrator) error { return o.Register(checkout) },
	}))
}
