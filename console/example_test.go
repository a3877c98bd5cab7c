package console_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/pgtest"
)

// Mount the console under /ops on a service's own mux, read-only.
func Example_mount() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	defer closeDB()

	c, err := console.New(db.Pool, console.Config{
		Schema:   db.Schema,
		Prefix:   "/ops",
		ReadOnly: true,
		Operator: console.HeaderOperator("X-Auth-Request-User"),
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", c)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/ops/")
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
