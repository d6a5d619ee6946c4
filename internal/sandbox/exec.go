package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// ExecIO connects an exec to local streams. Nil Stdin means no stdin; nil
// Stdout/Stderr discard.
type ExecIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Exec runs start in the guest (or through a shim) and streams its output.
// It returns the exit record; a non-nil error means the exec itself failed
// (bad request, sandbox gone), not that the command exited non-zero.
// Cancelling ctx kills the process in the guest.
func Exec(ctx context.Context, c *agentapi.Client, start *agentv1.ExecStart, stdio ExecIO) (*agentv1.ExecExited, error) {
	start.Stdin = stdio.Stdin != nil
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := c.Exec.Exec(ctx)
	defer func() { _ = st.CloseResponse() }()
	if err := st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: start}}); err != nil {
		_, rerr := st.Receive()
		return nil, fmt.Errorf("start exec: %w", errors.Join(err, rerr))
	}
	var sendMu sync.Mutex
	if stdio.Stdin != nil {
		// Not waited for: a read from a terminal cannot be interrupted. The
		// goroutine ends at the reader's next return once the stream is done.
		go func() {
			buf := make([]byte, agentapi.ChunkSize)
			for {
				n, err := stdio.Stdin.Read(buf)
				if n > 0 {
					sendMu.Lock()
					serr := st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: append([]byte(nil), buf[:n]...)}})
					sendMu.Unlock()
					if serr != nil {
						return
					}
				}
				if err != nil {
					sendMu.Lock()
					_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_CloseStdin{CloseStdin: true}})
					sendMu.Unlock()
					return
				}
			}
		}()
	}
	out, errw := stdio.Stdout, stdio.Stderr
	if out == nil {
		out = io.Discard
	}
	if errw == nil {
		errw = io.Discard
	}
	for {
		ev, err := st.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, errors.New("exec ended without an exit status")
			}
			return nil, fmt.Errorf("exec: %w", err)
		}
		switch e := ev.GetEvent().(type) {
		case *agentv1.ExecResponse_Stdout:
			if _, err := out.Write(e.Stdout); err != nil {
				return nil, fmt.Errorf("write stdout: %w", err)
			}
		case *agentv1.ExecResponse_Stderr:
			if _, err := errw.Write(e.Stderr); err != nil {
				return nil, fmt.Errorf("write stderr: %w", err)
			}
		case *agentv1.ExecResponse_Exited:
			return e.Exited, nil
		}
	}
}
