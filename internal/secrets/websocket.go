package secrets

import (
	"fmt"
	"io"
	"net/http"
	"sync"
)

// relayWebSocket completes a WebSocket handshake the upstream accepted
// (resp is its 101, headers scrubbed like any response's) and then relays
// bytes both ways until both directions end or one fails. Nothing after
// the 101 is inspected: frames are neither injected into, nor checked for
// placeholders (a client's frames are masked), nor scrubbed. Each direction
// waits at most the upstream timeout for its next bytes.
func (s *session) relayWebSocket(resp *http.Response) error {
	if err := s.writeInterim(resp); err != nil {
		return err
	}
	s.guestConn.setRead(orDefault(s.ic.UpstreamTimeout, DefaultUpstreamTimeout))
	type half interface{ CloseWrite() error }
	relay := func(dst half, w io.Writer, r io.Reader) error {
		if _, err := io.Copy(w, r); err != nil {
			return err
		}
		return dst.CloseWrite()
	}
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	// Bytes already buffered on either side (read with the head) go first:
	// s.gr and s.ur drain their buffers before reading their conns.
	wg.Go(func() { errc <- relay(s.upstream, s.upstream, s.gr) })
	wg.Go(func() { errc <- relay(s.guest, s.guest, s.ur) })
	err := <-errc
	if err != nil {
		// Unblock the other direction (its error is this one's echo);
		// Serve closes both again.
		_ = s.guest.Close()
		_ = s.upstream.Close()
	}
	wg.Wait()
	if second := <-errc; err == nil {
		err = second
	}
	if err != nil {
		return fmt.Errorf("websocket relay: %w", err)
	}
	return nil
}
