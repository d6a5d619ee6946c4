package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// templateBench builds a template from a small Dockerfile (a cold build, a
// nonce making every key new, then the same build again from the cache)
// and times a sandbox of it until its server answers, against a plain
// sandbox that starts the same server and waits for it (the baseline, in
// the same run), median of runs.
func templateBench(ctx context.Context, m *sandbox.Manager, runs int, rtName string) ([][3]string, error) {
	dir, err := os.MkdirTemp("", "airlock-bench-template-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte("<p>bench</p>\n"), 0o644); err != nil {
		return nil, err
	}
	const serve = "python3 -m http.server 8000"
	df := fmt.Sprintf("FROM base\nENV NONCE=%s\nWORKDIR /srv\nCOPY index.html ./\nRUN echo built > built.txt\nCMD %s\n", rand.Text(), serve)
	c := sandbox.Local()
	name := "bench-" + strings.ToLower(rand.Text()[:8])
	o := sandbox.BuildOptions{Name: name, Dockerfile: []byte(df), Context: dir, Ready: "curl -sf localhost:8000"}
	defer func() {
		_ = m.RemoveTemplate(context.WithoutCancel(ctx), c, name)
		_, _ = m.PruneTemplateCache(context.WithoutCancel(ctx), c)
	}()
	t := time.Now()
	if _, err := m.BuildTemplate(ctx, c, o); err != nil {
		return nil, fmt.Errorf("cold build: %w", err)
	}
	cold := time.Since(t)
	t = time.Now()
	if _, err := m.BuildTemplate(ctx, c, o); err != nil {
		return nil, fmt.Errorf("cached build: %w", err)
	}
	cached := time.Since(t)

	answers := func(id string) error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			st, err := m.Exec(ctx, c, id, guest.ExecSpec{Argv: []string{"curl", "-sf", "-o", "/dev/null", "localhost:8000"}}, false)
			if err != nil {
				return err
			}
			exit, err := guest.Drain(st, nil, nil)
			st.Close()
			if err == nil && exit.Code == 0 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the server never answered (%v, exit %+v)", err, exit)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var fromTpl, plain []time.Duration
	for range runs {
		t := time.Now()
		sb, err := m.Create(ctx, c, sandbox.CreateOptions{Image: name})
		if err != nil {
			return nil, fmt.Errorf("create from the template: %w", err)
		}
		err = answers(sb.ID)
		fromTpl = append(fromTpl, time.Since(t))
		_ = m.Remove(context.WithoutCancel(ctx), c, sb.ID)
		if err != nil {
			return nil, err
		}

		t = time.Now()
		sb, err = m.Create(ctx, c, sandbox.CreateOptions{})
		if err != nil {
			return nil, err
		}
		st, err := m.Exec(ctx, c, sb.ID, guest.ExecSpec{Argv: []string{"/bin/sh", "-c", "exec setsid -f " + serve + " >/dev/null 2>&1 </dev/null"}}, false)
		if err == nil {
			_, err = guest.Drain(st, nil, nil)
			st.Close()
		}
		if err == nil {
			err = answers(sb.ID)
		}
		plain = append(plain, time.Since(t))
		_ = m.Remove(context.WithoutCancel(ctx), c, sb.ID)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
	}
	tpl, base := median(fromTpl), median(plain)
	how := "FROM base, WORKDIR, COPY, RUN, CMD; each step saved (memory and disk)"
	start := "the server saved running"
	if rtName == "gvisor" {
		how = "FROM base, WORKDIR, COPY, RUN, CMD; each step a sandbox over overlay layers, then one image"
		start = "the server started at create, ready check passed"
	}
	return [][3]string{
		{rtName + ": template build, cold (5 steps, 3 run in the builder, server started, ready check)", ms(cold), how},
		{rtName + ": template build, unchanged Dockerfile (from the cache)", ms(cached), fmt.Sprintf("%.0fx faster than cold", float64(cold)/float64(cached))},
		{rtName + ": sandbox of a template until its server answers", ms(tpl), fmt.Sprintf("%s; median of %d; baseline (create base, start %q, wait until it answers): %s, %.1fx", start, runs, serve, ms(base), float64(base)/float64(tpl))},
	}, nil
}
