package secrets

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
)

// injector swaps the placeholders of the secrets bound to one host for
// their values in a request's headers and URL. A secret scoped to a header
// ([Binding.Header]) is swapped in that header only; the session refuses a
// request that carries its placeholder anywhere else before the injector
// sees it.
type injector struct {
	bound []Binding
}

// request rewrites req in place and returns the names of the secrets it
// injected, in binding order, and the Basic credentials it re-encoded.
func (in injector) request(req *http.Request) (names []string, creds []credential) {
	used := make([]bool, len(in.bound))
	for name, values := range req.Header {
		for i, v := range values {
			var c *credential
			values[i], c = in.headerValue(name, v, used)
			if c != nil {
				creds = append(creds, *c)
			}
		}
	}
	if q := req.URL.RawQuery; q != "" {
		req.URL.RawQuery = in.replace(q, url.QueryEscape, used, "")
	}
	if p := req.URL.EscapedPath(); strings.Contains(p, placeholderPrefix) {
		if np := in.replace(p, url.PathEscape, used, ""); np != p {
			if unescaped, err := url.PathUnescape(np); err == nil {
				req.URL.Path, req.URL.RawPath = unescaped, np
			}
		}
	}
	for i, b := range in.bound {
		if used[i] {
			names = append(names, b.Name)
		}
	}
	return names, creds
}

// headerValue replaces placeholders in one header value; inside an
// Authorization or Proxy-Authorization "Basic" credential it decodes the
// base64, replaces and re-encodes, and returns the credential it built.
func (in injector) headerValue(name, v string, used []bool) (string, *credential) {
	if strings.EqualFold(name, "Authorization") || strings.EqualFold(name, "Proxy-Authorization") {
		scheme, cred, ok := strings.Cut(v, " ")
		if ok && strings.EqualFold(scheme, "Basic") {
			cred = strings.TrimLeft(cred, " ")
			if dec, err := base64.StdEncoding.DecodeString(cred); err == nil {
				if s := in.replace(string(dec), nil, used, name); s != string(dec) {
					// A value with a colon in the user-id would move the
					// split between user-id and password (RFC 7617), and a
					// host echoing the two would hand back pieces of it.
					user, _, _ := strings.Cut(string(dec), ":")
					colon := strings.Contains(in.replace(user, nil, make([]bool, len(in.bound)), name), ":")
					return scheme + " " + base64.StdEncoding.EncodeToString([]byte(s)), &credential{guest: string(dec), sent: s, colonInUser: colon}
				}
			}
		}
	}
	return in.replace(v, nil, used, name), nil
}

// replace swaps every bound placeholder in s for its value, passed through
// escape if not nil, and marks the secrets it used. header names the header
// field s belongs to ("" for the URL): a secret scoped to another header is
// left alone.
func (in injector) replace(s string, escape func(string) string, used []bool, header string) string {
	if !strings.Contains(s, placeholderPrefix) {
		return s
	}
	for i, b := range in.bound {
		if b.Header != "" && !strings.EqualFold(b.Header, header) {
			continue
		}
		if strings.Contains(s, b.Placeholder) {
			v := b.Value
			if escape != nil {
				v = escape(v)
			}
			s = strings.ReplaceAll(s, b.Placeholder, v)
			used[i] = true
		}
	}
	return s
}
