package console_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/migrations"
)

// Mount the console under /ops on a service's own mux, read-only.
func Example_mount() {
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
	if err == nil {
		_, err = m.Up(ctx) // millrace's tables
	}
	if err != nil {
		log.Fatal(err)
	}

	c, err := console.New(pool, console.Config{
		Schema:   schema,
		Prefix:   "/ops",
		ReadOnly: true,
		// Behind an authenticating proxy on this host: its headers name
		// the user and their groups (viewer, operator, admin).
		Authenticate: console.ProxyAuth("X-Auth-Request-User", "X-Auth-Request-Groups", netip.MustParsePrefix("127.0.0.1/32")),
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", c)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, err := http.NewRequest(http.MethodGet, srv.URL+"/ops/", nil)
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("X-Auth-Request-User", "ada") // as the proxy sets it
	req.Header.Set("X-Auth-Request-Groups", "viewer")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.Status)
	fmt.Println(regexp.MustCompile(`id="pending">[^<]*`).FindString(string(body)))
	// Output:
	// 200 OK
	// id="pending">0
}
