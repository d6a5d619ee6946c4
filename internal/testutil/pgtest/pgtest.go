// Package pgtest runs a real PostgreSQL server for tests: Debian's
// binaries (the postgresql package, which scripts/deps.sh installs), a
// fresh cluster in a temporary directory, listening on a loopback port
// only, with no Unix socket, fsync off, and trust authentication for one
// superuser. Each test gets a database of its own (Server.Database).
//
// The catalog's tests run on it with AIRLOCK_TEST_POSTGRES=1
// (`make test-postgres`); the cluster's control tier is tested on it too.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// Enabled reports whether the PostgreSQL tier is asked for
// (AIRLOCK_TEST_POSTGRES=1).
func Enabled() bool { return os.Getenv("AIRLOCK_TEST_POSTGRES") == "1" }

// Server is one running PostgreSQL cluster.
type Server struct {
	dir  string
	port int
	cmd  *exec.Cmd
	log  *bytes.Buffer // the server's output
	done chan struct{} // closed when the server process exited
	mu   sync.Mutex
	err  error // how it exited
	db   *sql.DB
}

const superuser = "airlock"

// Bin finds Debian's PostgreSQL binaries: the newest
// /usr/lib/postgresql/<major>/bin holding initdb and postgres.
func Bin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return majorOf(b) - majorOf(a) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("pgtest: no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: install Debian's postgresql package (make deps)")
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Start initializes and starts a server; Stop ends it and removes its
// files. Run as root, the server runs as the postgres user (PostgreSQL
// refuses root).
func Start(ctx context.Context) (*Server, error) {
	bin, err := Bin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "airlock-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cred, err := serverUser(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", superuser, "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	// A port picked free can be taken before the server binds it: try a
	// few.
	var lastErr error
	for range 3 {
		s, err := start(ctx, bin, dir, data, cred)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// serverUser is the credential the server runs with: the postgres user
// when this process is root (dir is given to it), else none (this user).
func serverUser(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs the postgres user (Debian's postgresql package creates it): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func start(ctx context.Context, bin, dir, data string, cred *syscall.Credential) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, port: port, log: new(bytes.Buffer), done: make(chan struct{})}
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port),
		"-c", "unix_socket_directories=", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "log_min_messages=warning")
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = (*lockedWriter)(s), (*lockedWriter)(s)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: start postgres: %w", err)
	}
	go func() {
		err := s.cmd.Wait()
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
	}()
	if s.db, err = sql.Open("pgx", s.url("postgres")); err != nil {
		s.kill()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := s.waitReady(ctx, 30*time.Second); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

type lockedWriter Server

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.log.Write(p)
}

// Log is what the server printed so far.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// waitReady waits until the server answers a query, it exits, or the
// deadline passes.
func (s *Server) waitReady(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var one int
		err := s.db.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("pgtest: postgres exited before it was ready (%v):\n%s", s.err, s.Log())
		case <-ctx.Done():
			return fmt.Errorf("pgtest: postgres not ready within %s (last: %v):\n%s", within, err, s.Log())
		case <-tick.C:
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) url(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, s.port, db)
}

// Database creates a new, empty database and returns its URL.
func (s *Server) Database(ctx context.Context) (string, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	if _, err := s.db.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return s.url(name), nil
}

// Stop ends the server (a fast shutdown, then SIGKILL after 10 s) and
// removes its files.
func (s *Server) Stop() {
	if s.db != nil {
		s.db.Close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.kill()
	}
	os.RemoveAll(s.dir)
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}
