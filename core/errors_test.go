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

func TestListParamsNormalize(t *testing.T) {
	t.Parallel()
	if p, err := (ListParams{}).Normalize(); err != nil || p.Limit != DefaultListLimit {
		t.Fatalf("zero ListParams: %+v, %v", p, err)
	}
	if p, err := (ListParams{Limit: 3, AfterID: 7, Topic: "t"}).Normalize(); err != nil || p != (ListParams{Limit: 3, AfterID: 7, Topic: "t"}) {
		t.Fatalf("set ListParams changed: %+v, %v", p, err)
	}
	for _, p := range []ListParams{{Limit: -1}, {AfterID: -1}} {
		if _, err := p.Normalize(); !errors.Is(err, ErrInvalidListParams) {
			t.Fatalf("%+v: %v, want ErrInvalidListParams", p, err)
		}
	}
}
