package outbox_test

import (
	"encoding/json"
	"testing"

	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/testdata/protocol"
)

// The lanes of testdata/protocol/outbox.json, the specification's: FNV-1a
// of the partition key modulo Lanes, as a writer in another language
// computes them.
func TestLaneVectors(t *testing.T) {
	t.Parallel()
	body, err := protocol.FS.ReadFile("outbox.json")
	if err != nil {
		t.Fatal(err)
	}
	var ob struct {
		Lanes []struct {
			PartitionKey string `json:"partition_key"`
			Lane         int16
		}
	}
	if err := json.Unmarshal(body, &ob); err != nil {
		t.Fatal(err)
	}
	if len(ob.Lanes) == 0 {
		t.Fatal("no lane vectors")
	}
	for _, l := range ob.Lanes {
		if got := outbox.Lane(l.PartitionKey); got != l.Lane {
			t.Errorf("lane of %q = %d, the vector says %d", l.PartitionKey, got, l.Lane)
		}
	}
}
