package core

import (
	"errors"
	"testing"
)

func TestPermanent(t *testing.T) {
	t.Parallel()
	base := errors.New("too large")
	p := Permanent(base)
	if !IsPermanent(p) || !errors.Is(p, base) {
		t.Fatalf("Permanent(%v): IsPermanent=%v, Is(base)=%v", base, IsPermanent(p), errors.Is(p, base))
	}
	if IsPermanent(base) {
		t.Fatal("plain error reported permanent")
	}
	if Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	be := &BatchError{Errors: []MessageError{{UUID: "a", Err: p}, {UUID: "b", Err: errors.New("x")}}}
	if !IsPermanent(be) {
		t.Fatal("BatchError does not expose a permanent member")
	}
	if be.Error() == "" {
		t.Fatal("empty message")
	}
}
