package boot

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LoadModules loads the kernel modules listed in dir/order (one file name a
// line, in load order) with finit_module. A module that is already loaded is
// fine; other failures are logged and loading goes on. It returns how many
// modules were loaded or already present.
func LoadModules(log *slog.Logger, dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "order"))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Error("read module order", "err", err)
		}
		return 0
	}
	ok := 0
	for line := range strings.Lines(string(b)) {
		name := strings.TrimSpace(line)
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		if strings.Contains(name, "/") {
			log.Error("module name has a slash", "module", name)
			continue
		}
		if err := loadModule(filepath.Join(dir, name)); err != nil {
			log.Error("load module", "module", name, "err", err)
			continue
		}
		ok++
	}
	return ok
}

func loadModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags := 0
	switch filepath.Ext(path) {
	case ".xz", ".zst", ".gz":
		// Needs CONFIG_MODULE_DECOMPRESS; the initramfs normally holds
		// plain .ko files.
		flags |= unix.MODULE_INIT_COMPRESSED_FILE
	}
	for {
		err = unix.FinitModule(fd, "", flags)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		return err
	}
}
