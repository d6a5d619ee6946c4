// Command etcd is the etcd server, as the etcd release builds it: the
// kube tier's storage for kube-apiserver (scripts/kube-bins.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
