package image

import (
	"context"
	"fmt"
	"sync"
)

// MemIndex is an in-memory Index, for tests and tools. The zero value is
// ready to use.
type MemIndex struct {
	mu     sync.Mutex
	images map[string]Image
}

var _ Index = (*MemIndex)(nil)

// NewMemIndex returns an empty MemIndex.
func NewMemIndex() *MemIndex { return &MemIndex{} }

// PutImage implements Index.
func (m *MemIndex) PutImage(ctx context.Context, img Image) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.images == nil {
		m.images = map[string]Image{}
	}
	m.images[img.Name] = img
	return nil
}

// GetImage implements Index.
func (m *MemIndex) GetImage(ctx context.Context, name string) (Image, error) {
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[name]
	if !ok {
		return Image{}, fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	return img, nil
}

// ListImages implements Index.
func (m *MemIndex) ListImages(ctx context.Context) ([]Image, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Image, 0, len(m.images))
	for _, img := range m.images {
		out = append(out, img)
	}
	return out, nil
}

// DeleteImage implements Index.
func (m *MemIndex) DeleteImage(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.images[name]; !ok {
		return fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	delete(m.images, name)
	return nil
}
