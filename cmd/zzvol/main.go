// Scratch: not committed.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func main() {
	ctx := context.Background()
	l := statedir.Layout{Root: os.Getenv("SD")}
	st, err := store.Open(ctx, l.Catalog())
	if err != nil {
		panic(err)
	}
	rt := os.Getenv("RT")
	m := &sandbox.Manager{L: l, Store: st, Log: slog.Default(), Exe: os.Getenv("EXE"),
		Runtime: func(context.Context) (string, error) { return rt, nil }}
	switch os.Args[1] {
	case "vol":
		v, err := m.CreateVolume(ctx, sandbox.Local(), os.Args[2], 64)
		fmt.Println(v, err)
	case "create":
		var vols []sandbox.VolumeMount
		var hosts []sandbox.HostMount
		for _, a := range os.Args[2:] {
			f := strings.Split(a, ":")
			if strings.HasPrefix(f[0], "/") {
				hosts = append(hosts, sandbox.HostMount{HostPath: f[0], Path: f[1], ReadWrite: len(f) > 2 && f[2] == "rw"})
			} else {
				vols = append(vols, sandbox.VolumeMount{Name: f[0], Path: f[1], ReadOnly: len(f) > 2 && f[2] == "ro"})
			}
		}
		sb, err := m.Create(ctx, sandbox.Local(), sandbox.CreateOptions{Volumes: vols, HostMounts: hosts})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		fmt.Println(sb.ID, sb.StartMode)
	}
}
