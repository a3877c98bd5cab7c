// Command pgping exits 0 when the PostgreSQL at the URL answers; with
// -create NAME it first creates database NAME there. scripts/pg-up.sh uses it
// where psql is not installed.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	create := flag.String("create", "", "create this database")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close(ctx)
	if *create != "" {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{*create}.Sanitize()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := conn.Ping(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
