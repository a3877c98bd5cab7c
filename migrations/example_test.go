package migrations_test

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/migrations"
)

func Example_migrate() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// A schema of its own, dropped at the end.
	schema := fmt.Sprintf("example_%08x", rand.Uint32())
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck

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
