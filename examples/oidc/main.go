// Command oidc serves millrace's console behind an OpenID Connect login:
// the recipe of "Securing the console" in docs/operating.md, as a program
// that builds. It is a module of its own, so that millrace itself does not
// depend on an OIDC library.
//
// The host does the login (the authorization code flow, with
// golang.org/x/oauth2) and keeps the ID token in an HttpOnly cookie; the
// console's TokenAuth hands that token to the host's check, which verifies
// it with github.com/coreos/go-oidc (signature, issuer, audience, expiry:
// never by hand) and maps the token's groups to the console's roles.
//
//	OIDC_ISSUER=https://login.example.com OIDC_CLIENT_ID=... OIDC_CLIENT_SECRET=... \
//	OIDC_REDIRECT_URL=https://ops.example.com/callback DATABASE_URL=... go run .
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"

	"github.com/millrace/millrace/console"
)

// roles maps the identity provider's groups to the console's roles.
var roles = map[string]string{"ops-viewers": "viewer", "oncall": "operator", "platform": "admin"}

func main() {
	ctx := context.Background()
	provider, err := oidc.NewProvider(ctx, os.Getenv("OIDC_ISSUER"))
	if err != nil {
		log.Fatal(err)
	}
	clientID := os.Getenv("OIDC_CLIENT_ID")
	oauth := oauth2.Config{
		ClientID: clientID, ClientSecret: os.Getenv("OIDC_CLIENT_SECRET"), RedirectURL: os.Getenv("OIDC_REDIRECT_URL"),
		Endpoint: provider.Endpoint(), Scopes: []string{oidc.ScopeOpenID, "email", "groups"},
	}
	verifier := provider.Verifier(&oidc.Config{ClientID: clientID})

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ops, err := console.New(pool, console.Config{
		Prefix: "/ops",
		// The ID token in the cookie the callback sets, verified on every
		// request: an expired one is refused (401), and the user logs in
		// again.
		Authenticate: console.TokenAuth("id_token", func(ctx context.Context, raw string) (console.Identity, error) {
			tok, err := verifier.Verify(ctx, raw)
			if err != nil {
				return console.Identity{}, err
			}
			var claims struct {
				Email    string   `json:"email"`
				Verified bool     `json:"email_verified"`
				Groups   []string `json:"groups"`
			}
			if err := tok.Claims(&claims); err != nil {
				return console.Identity{}, err
			}
			if claims.Email == "" || !claims.Verified {
				return console.Identity{}, errors.New("the token has no verified email")
			}
			id := console.Identity{Name: claims.Email}
			for _, g := range claims.Groups {
				if r, ok := roles[g]; ok && !slices.Contains(id.Roles, r) {
					id.Roles = append(id.Roles, r)
				}
			}
			return id, nil
		}),
		CSRFKey: []byte(os.Getenv("CONSOLE_CSRF_KEY")), // the same 32+ bytes on every replica
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("/ops/", ops)
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, r *http.Request) {
		state := random()
		setCookie(w, "oidc_state", state, 10*time.Minute)
		http.Redirect(w, r, oauth.AuthCodeURL(state), http.StatusFound)
	})
	mux.HandleFunc("GET /callback", func(w http.ResponseWriter, r *http.Request) {
		state, err := r.Cookie("oidc_state")
		if err != nil || r.URL.Query().Get("state") != state.Value {
			http.Error(w, "bad login state: start again at /login", http.StatusBadRequest)
			return
		}
		tok, err := oauth.Exchange(r.Context(), r.URL.Query().Get("code"))
		if err != nil {
			http.Error(w, "login failed", http.StatusBadGateway)
			return
		}
		raw, ok := tok.Extra("id_token").(string)
		if !ok {
			http.Error(w, "the provider sent no ID token", http.StatusBadGateway)
			return
		}
		if _, err := verifier.Verify(r.Context(), raw); err != nil {
			http.Error(w, "the ID token does not verify", http.StatusUnauthorized)
			return
		}
		setCookie(w, "id_token", raw, time.Hour)
		http.Redirect(w, r, "/ops/", http.StatusFound)
	})
	srv := &http.Server{Addr: ":8443", Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// TLS is the host's: the cookies are Secure.
	log.Fatal(srv.ListenAndServeTLS(os.Getenv("TLS_CERT"), os.Getenv("TLS_KEY")))
}

func setCookie(w http.ResponseWriter, name, value string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: int(maxAge.Seconds()),
		HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode})
}

func random() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
