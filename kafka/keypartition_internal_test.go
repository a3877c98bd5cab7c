package kafka

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// KeyPartition agrees with the partitioner the Publisher uses, for keys
// whose hash is negative as an int32 too.
func TestKeyPartitionIsThePublishersPartitioner(t *testing.T) {
	t.Parallel()
	part := kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))
	negative := 0
	for _, n := range []int32{1, 3, 12, 64} {
		tp := part.ForTopic("t")
		for i := range 2000 {
			key := fmt.Sprintf("saga-%d", i)
			if int32(fnv32a([]byte(key))) < 0 {
				negative++
			}
			if got, want := KeyPartition(key, n), int32(tp.Partition(&kgo.Record{Key: []byte(key)}, int(n))); got != want {
				t.Fatalf("KeyPartition(%q, %d) = %d, the publisher's partitioner says %d", key, n, got, want)
			}
		}
	}
	if negative == 0 {
		t.Fatal("no key with a negative hash: the test did not test the sign")
	}
}
