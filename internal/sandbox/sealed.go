package sandbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// Secret values across pause, resume and fork. A running sandbox's values
// live in its shim's memory only. So that a new shim can bind them again
// (after a pause, or for a fork that asked for them), the control plane
// keeps them sealed in the sandbox's directory: AES-256-GCM under a key of
// the host's (secretsKeyFile in the state dir), with the sandbox's id as
// additional data, so a sealed file moved to another sandbox does not
// open. A snapshot never holds them: the guest only ever had placeholders,
// and neither the key nor the sealed file is part of a snapshot. Removing
// the sandbox removes its sealed values.

const (
	// secretsKeyFile is the host's sealing key, in the state dir.
	secretsKeyFile = "secrets.key"
	// sealedSecretsFile holds a sandbox's sealed values, in its directory.
	sealedSecretsFile = "secrets.sealed"
)

// sealingKey returns the host's sealing key, creating it on first use.
func (m *Manager) sealingKey() ([]byte, error) {
	path := filepath.Join(m.L.Root, secretsKeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return m.sealingKey() // another process made it first
		}
		if err != nil {
			return nil, fmt.Errorf("create the secrets key: %w", err)
		}
		_, werr := f.Write(key)
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			_ = os.Remove(path)
			return nil, fmt.Errorf("write the secrets key: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the secrets key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("the secrets key %s is %d bytes, not 32: it is damaged, and the sealed secrets of existing sandboxes cannot be opened", path, len(key))
	}
	return key, nil
}

func (m *Manager) secretsAEAD() (cipher.AEAD, error) {
	key, err := m.sealingKey()
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal encrypts plain under the host's key, bound to aad (a sealed blob
// opens only with the same aad).
func (m *Manager) seal(plain, aad []byte) ([]byte, error) {
	aead, err := m.secretsAEAD()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := io.ReadFull(rand.Reader, nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, plain, aad), nil
}

// errUnseal is a sealed blob that does not open.
var errUnseal = errors.New("damaged, or sealed under another key or for another owner")

// unseal opens what seal sealed with the same aad. The caller clears the
// result when done.
func (m *Manager) unseal(sealed, aad []byte) ([]byte, error) {
	aead, err := m.secretsAEAD()
	if err != nil {
		return nil, err
	}
	if len(sealed) < aead.NonceSize() {
		return nil, errUnseal
	}
	plain, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], aad)
	if err != nil {
		return nil, errUnseal
	}
	return plain, nil
}

// sealSecrets keeps sandbox id's secret values, sealed, in its directory
// (replacing what it kept: a live change of its secrets seals the new set).
func (m *Manager) sealSecrets(id string, vals netconf.Values) error {
	plain, err := json.Marshal(vals)
	if err != nil {
		return err
	}
	sealed, err := m.seal(plain, []byte(id))
	clear(plain)
	if err != nil {
		return err
	}
	path := filepath.Join(m.L.Dir(id), sealedSecretsFile)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, sealed, 0o600); err != nil {
		return fmt.Errorf("seal the secrets: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("seal the secrets: %w", err)
	}
	return nil
}

// openSecrets returns sandbox id's sealed secret values.
func (m *Manager) openSecrets(id string) (netconf.Values, error) {
	sealed, err := os.ReadFile(filepath.Join(m.L.Dir(id), sealedSecretsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the sealed secret values of sandbox %s are missing", id)
	}
	if err != nil {
		return nil, err
	}
	plain, err := m.unseal(sealed, []byte(id))
	if errors.Is(err, errUnseal) {
		return nil, fmt.Errorf("the sealed secret values of sandbox %s do not open (damaged, or sealed under another key or for another sandbox)", id)
	}
	if err != nil {
		return nil, err
	}
	defer clear(plain)
	var vals netconf.Values
	if err := json.Unmarshal(plain, &vals); err != nil {
		return nil, fmt.Errorf("the sealed secret values of sandbox %s are damaged: %w", id, err)
	}
	return vals, nil
}
