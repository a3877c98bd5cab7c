package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// csrfCookie holds a random nonce; csrfField, in every form, holds the
// HMAC of the nonce and the identity's name under the console's key. A
// POST is accepted only with both, and only if they match for the
// identity that posts: the signed double-submit pattern, bound to the
// operator. Another site can make a browser send the cookie but cannot
// read it, nor compute the HMAC without the key; a cookie planted by a
// sibling subdomain does not help it either, for the same reason; and a
// token one operator's page carried is refused for another operator.
const (
	csrfCookie = "millrace_console_csrf"
	csrfField  = "csrf_token"
)

type csrf struct {
	key  []byte
	path string // cookie path: the console's prefix
}

func (c *csrf) sign(nonce, who string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("millrace console csrf v2\x00"))
	m.Write([]byte(nonce))
	m.Write([]byte{0})
	m.Write([]byte(who))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// token returns the token of who for the page being served, setting a new
// nonce cookie when the request has none.
func (c *csrf) token(w http.ResponseWriter, r *http.Request, who string) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 32 {
		return c.sign(ck.Value, who)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	nonce := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: nonce, Path: c.path,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	return c.sign(nonce, who)
}

// valid reports whether the POST r of who carries a token matching its
// cookie and who. The form must have been parsed.
func (c *csrf) valid(r *http.Request, who string) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || len(ck.Value) < 32 {
		return false
	}
	got := r.PostFormValue(csrfField)
	if got == "" {
		return false
	}
	return hmac.Equal([]byte(got), []byte(c.sign(ck.Value, who)))
}
