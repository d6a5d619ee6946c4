package agent

import (
	"errors"
	"fmt"
	"syscall"

	"connectrpc.com/connect"
)

// maxErrorText caps the text of an error sent to the host.
const maxErrorText = 256

// invalidf returns an InvalidArgument error.
func invalidf(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, errors.New(truncate(fmt.Sprintf(format, args...))))
}

// preconditionf returns a FailedPrecondition error.
func preconditionf(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, errors.New(truncate(fmt.Sprintf(format, args...))))
}

// sysError turns the error of a failed step into an RPC error whose code
// follows the errno and whose text is "op: errno text": it never carries the
// path or argv (the host knows what it asked for, and messages stay short).
func sysError(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return connect.NewError(connect.CodeInternal, errors.New(truncate(op+": "+err.Error())))
	}
	return connect.NewError(errnoCode(errno), errors.New(truncate(op+": "+errno.Error())))
}

func errnoCode(errno syscall.Errno) connect.Code {
	switch errno {
	case syscall.ENOENT, syscall.ESRCH:
		return connect.CodeNotFound
	case syscall.EEXIST:
		return connect.CodeAlreadyExists
	case syscall.EACCES, syscall.EPERM:
		return connect.CodePermissionDenied
	case syscall.ENOTDIR, syscall.EISDIR, syscall.ELOOP, syscall.ENOTEMPTY, syscall.EROFS,
		syscall.EBUSY, syscall.ETXTBSY, syscall.ENOEXEC, syscall.EXDEV:
		return connect.CodeFailedPrecondition
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.E2BIG:
		return connect.CodeInvalidArgument
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.EAGAIN, syscall.EFBIG:
		return connect.CodeResourceExhausted
	default:
		return connect.CodeUnknown
	}
}

func truncate(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return s[:maxErrorText-3] + "..."
}
