package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// A cluster's nodes serve this API to the control tier only (`airlock
// node`, Config.NodeToken). The control tier authenticates the tenant's
// key against the cluster's catalog and then calls the node with the node
// token and the key it authenticated, in NodeCallerHeader; the node acts
// for that key's tenant with its limits. Nothing else authenticates on a
// node: no API key, no dashboard session, no signed browser URL.

// NodeCallerHeader carries the caller the control tier authenticated: a
// store.APIKey as JSON (its Created and hash are not used).
const NodeCallerHeader = "X-Airlock-Caller"

// MinNodeToken is the shortest node token accepted, in bytes.
const MinNodeToken = 32

// maxNodeCaller bounds NodeCallerHeader.
const maxNodeCaller = 4096

// NodeCaller encodes k for NodeCallerHeader.
func NodeCaller(k store.APIKey) string {
	b, _ := json.Marshal(k) // plain fields: never fails
	return string(b)
}

// nodeAuthenticate is authenticate on a node.
func (s *Server) nodeAuthenticate(next http.Handler) http.Handler {
	want := sha256.Sum256(s.cfg.NodeToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		got := sha256.Sum256([]byte(tok))
		if !ok || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			s.denied(r, "not the node token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock-node"`)
			s.fail(w, r, errUnauth)
			return
		}
		k, err := parseNodeCaller(r.Header.Get(NodeCallerHeader))
		if err != nil {
			s.fail(w, r, &Error{http.StatusBadRequest, "invalid_argument", err.Error()})
			return
		}
		noteKey(r, k)
		c := sandbox.KeyCaller(k, s.cfg.Defaults, "cluster")
		r = r.WithContext(context.WithValue(r.Context(), keyCtx{}, authed{k, c}))
		next.ServeHTTP(w, r)
	})
}

// parseNodeCaller reads and checks NodeCallerHeader's key: a tenant (the
// local user, tenant "", is not one a node acts for), limits that are not
// negative, not revoked.
func parseNodeCaller(h string) (store.APIKey, error) {
	var k store.APIKey
	if h == "" {
		return k, errors.New("node: the " + NodeCallerHeader + " header is missing")
	}
	if len(h) > maxNodeCaller {
		return k, fmt.Errorf("node: the %s header is over %d bytes", NodeCallerHeader, maxNodeCaller)
	}
	d := json.NewDecoder(bytes.NewReader([]byte(h)))
	d.DisallowUnknownFields()
	if err := d.Decode(&k); err != nil {
		return k, fmt.Errorf("node: the %s header: %v", NodeCallerHeader, err)
	}
	if err := store.ValidateTenant(k.Tenant); err != nil || k.Tenant == "" {
		return k, fmt.Errorf("node: the %s header names no valid tenant", NodeCallerHeader)
	}
	if k.Revoked {
		return k, fmt.Errorf("node: the %s header's key is revoked", NodeCallerHeader)
	}
	if err := k.Validate(); err != nil {
		return k, fmt.Errorf("node: the %s header: %w", NodeCallerHeader, err)
	}
	return k, nil
}
