package migrations_test

import (
	"context"
	"fmt"
	"log"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/migrations"
)

func Example_migrate() {
	ctx := context.Background()
	pool, err := pgtest.Connect(ctx, pgtest.URL(), 2)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := pgtest.RandomName("example")
	defer pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`) //nolint:errcheck

	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	res, err := m.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied:", len(res.Applied) == migrations.Latest(), "valid:", m.Validate(ctx) == nil)
	// Output: applied: true valid: true
}
