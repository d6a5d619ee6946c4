package shim

import (
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
