package core

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type txKey struct{}

// ContextWithTx returns a copy of ctx that carries tx. The inbox's dedup
// middleware puts its transaction there for the handler, and the outbox's
// context publisher writes events into the transaction it finds there, so a
// handler's database changes, the dedup mark and the events it emits commit
// together.
func ContextWithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFromContext returns the transaction ContextWithTx stored in ctx.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}
