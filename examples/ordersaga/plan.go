package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// plan is what a run places and how scarce credit and stock are. It is
// computed from the config alone, so services in separate processes agree
// on it (which customers and SKUs exist, which sagas the faults hit).
type plan struct {
	orders    []Order
	customers []customer
	skus      []sku

	// The sagas the faults hit.
	slowStock    string // inventory's reply to its first reserve_stock comes after the timeout
	flakyRelease string // its credit release fails twice, then succeeds
	heldRelease  string // its credit release fails until an operator lifts a hold: stuck, then fixed
}

type customer struct {
	id     string
	credit int64
}

type sku struct {
	id    string
	stock int
}

// Step timeouts: generous for every step (a reply is normally back in
// milliseconds), shorter for reserve_stock, whose reply comes late once.
const (
	stepTimeout  = 10 * time.Second
	stockTimeout = 5 * time.Second
	stockLate    = stockTimeout + 3*time.Second // well past the timeout, even when the timers run late
)

// newPlan makes n orders over n/12 customers and n/15 SKUs; credit and
// stock cover about 80% of the demand, so some orders fail at payment or
// at inventory and are compensated. Three dedicated orders carry the
// faults that need a saga to end a given way.
func newPlan(n int, seed uint64) *plan {
	rng := rand.New(rand.NewPCG(seed, 0x5a6a))
	nc, ns := max(3, n/12), max(3, n/15)
	p := &plan{}
	for i := range nc {
		p.customers = append(p.customers, customer{id: fmt.Sprintf("c-%03d", i+1)})
	}
	for i := range ns {
		p.skus = append(p.skus, sku{id: fmt.Sprintf("sku-%02d", i+1)})
	}
	demandCredit := make([]int64, nc)
	demandStock := make([]int, ns)
	for i := range n {
		c, k := rng.IntN(nc), rng.IntN(ns)
		o := Order{ID: orderID(i + 1), Customer: p.customers[c].id, SKU: p.skus[k].id, Qty: 1 + rng.IntN(3), Amount: int64(10 + rng.IntN(91))}
		demandCredit[c] += o.Amount
		demandStock[k] += o.Qty
		p.orders = append(p.orders, o)
	}
	for i := range p.customers {
		p.customers[i].credit = demandCredit[i] * 8 / 10
	}
	for i := range p.skus {
		p.skus[i].stock = demandStock[i] * 8 / 10
	}

	// The fault orders: customers with ample credit, so the saga gets past
	// payment; "sku-slow" has ample stock, "sku-sold-out" none, so those
	// sagas compensate their credit.
	p.customers = append(p.customers, customer{"c-slow", 1 << 40}, customer{"c-flaky", 1 << 40}, customer{"c-held", 1 << 40})
	p.skus = append(p.skus, sku{"sku-slow", 1 << 20}, sku{"sku-sold-out", 0})
	special := func(at int, cust, sku string) string {
		o := &p.orders[at]
		o.Customer, o.SKU = cust, sku
		return o.ID
	}
	p.slowStock = special(n/4, "c-slow", "sku-slow")
	p.flakyRelease = special(n/2, "c-flaky", "sku-sold-out")
	p.heldRelease = special(3*n/4, "c-held", "sku-sold-out")
	return p
}

func orderID(i int) string { return fmt.Sprintf("order-%05d", i) }

// fraudulent reports whether the fraud check at approval refuses the
// order: one in 25.
func (p *plan) fraudulent(sagaID string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(sagaID, "order-"))
	return err == nil && n%25 == 11
}

// flakyCarrier reports whether the carrier fails for this saga's shipment
// at first: every fifth order.
func (p *plan) flakyCarrier(sagaID string) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(sagaID, "order-"))
	return err == nil && n%5 == 3
}
