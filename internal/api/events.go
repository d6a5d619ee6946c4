package api

import (
	"net/http"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/store"
)

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.EventFilter{SandboxID: q.Get("sandbox"), Type: q.Get("type")}
	k := keyOf(r)
	if !k.Admin {
		f.Tenant = k.Tenant
	}
	for name, dst := range map[string]*int64{"since": &f.Since} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				s.fail(w, r, invalidf("%s must be a non-negative integer", name))
				return
			}
			*dst = n
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			s.fail(w, r, invalidf("limit must be between 1 and 10000"))
			return
		}
		f.Limit = n
	}
	evs, err := s.cfg.Events.ListEvents(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	next := f.Since
	if len(evs) > 0 {
		next = evs[len(evs)-1].Seq
	}
	for i := range evs {
		if evs[i].Detail == nil {
			evs[i].Detail = map[string]any{}
		}
	}
	if evs == nil {
		evs = []store.Event{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": evs, "next": next})
}
