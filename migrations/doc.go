// Package migrations holds millrace's versioned SQL and applies it.
//
// The schema is a series of numbered migrations, each an NNN_name.up.sql
// and NNN_name.down.sql file embedded in the binary. A Migrator applies them
// to one PostgreSQL schema (default "millrace"), records what it applied in
// that schema's schema_migration table, and takes a transaction-scoped
// advisory lock so that two processes migrating at once do not collide:
//
//	m, err := migrations.New(pool, migrations.Config{Schema: "millrace"})
//	res, err := m.Up(ctx)          // apply everything pending
//	v, err := m.Version(ctx)       // highest applied version
//	err = m.Validate(ctx)          // nil when the database matches the code
//	res, err = m.Down(ctx, 0)      // revert everything
//
// Every call runs in a transaction of its own: DDL never runs in a
// caller's transaction.
// A database that has a migration applied that this version of millrace
// does not know is refused with ErrDatabaseNewer and left untouched.
//
// # Other migration tools
//
// Teams that run goose, golang-migrate or Atlas can take the files as they
// are: FS holds them, and All returns them in order. The statements are not
// schema-qualified; run them after SET search_path TO your schema.
package migrations
