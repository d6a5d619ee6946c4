package airlock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// recordTooLongError is a record longer than the reader's cap.
type recordTooLongError struct{ max int }

func (e recordTooLongError) Error() string { return fmt.Sprintf("record longer than %d bytes", e.max) }

// recordReader reads the non-empty records (lines) of an NDJSON stream.
type recordReader struct {
	br   *bufio.Reader
	max  int
	line []byte
}

func newRecordReader(r io.Reader, max int) *recordReader {
	return &recordReader{br: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next non-empty record, trimmed; it is valid until the
// next call. A stream's callers read until their final record, so the end
// of the stream is io.ErrUnexpectedEOF, and partial says a record was cut
// off there. A record over the cap is a recordTooLongError.
func (rr *recordReader) next() (rec []byte, partial bool, err error) {
	for {
		chunk, err := rr.br.ReadSlice('\n')
		rr.line = append(rr.line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(rr.line) > rr.max {
				return nil, false, recordTooLongError{rr.max}
			}
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, len(bytes.TrimSpace(rr.line)) > 0, io.ErrUnexpectedEOF
			}
			return nil, false, err
		}
		rec := bytes.TrimSpace(rr.line)
		rr.line = rr.line[:0]
		if len(rec) > 0 {
			return rec, false, nil
		}
	}
}
