#!/usr/bin/env bash
# Builds kube-apiserver and etcd for the kube tier (internal/testutil/kubetest,
# make test-kube) from the Go module proxy, once per version, into
# .cache/tools/kube-<kubernetes version>-etcd-<etcd version>/. The versions
# are the ones the tool modules pin: tools/kube/apiserver/go.mod
# (k8s.io/kubernetes) and tools/kube/etcd/go.mod (go.etcd.io/etcd/server/v3).
# A no-op when both binaries are there. Progress goes to stderr; the last
# line on stdout is the directory, so `dir=$(scripts/kube-bins.sh)` works.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
export GOWORK=off CGO_ENABLED=0

k8s=$(cd tools/kube/apiserver && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd=$(cd tools/kube/etcd && "$GO" list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
dir=$PWD/.cache/tools/kube-$k8s-etcd-$etcd

if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
	echo "$dir"
	exit 0
fi

# k8s.io/kubernetes v1.X.Y is released with its staging modules at v0.X.Y:
# every replace of tools/kube/apiserver/go.mod must say so, or the binary
# would mix releases.
staging=v0.${k8s#v1.}
bad=$(awk -v want="$staging" '$2 == "=>" && $1 ~ /^k8s\.io\// && $4 != want {print $1 " => " $3 " " $4}' tools/kube/apiserver/go.mod)
if [ -n "$bad" ]; then
	echo "kube-bins: tools/kube/apiserver/go.mod requires k8s.io/kubernetes $k8s, so every staging replace must be $staging; these are not:" >&2
	echo "$bad" >&2
	exit 1
fi

mkdir -p "$dir"
# One build at a time per directory: a second run waits, then finds the
# binaries.
exec 9>"$dir/.lock"
flock 9

build() { # build NAME VERSION ESTIMATE MODULE-DIR PACKAGE [LDFLAGS]
	local name=$1 version=$2 estimate=$3 moddir=$4 pkg=$5 ldflags=${6:-}
	if [ -x "$dir/$name" ]; then
		return
	fi
	local tmp=$dir/.$name.tmp.$$
	echo "kube-bins: building $name $version ($estimate, once per version) into $dir" >&2
	local start=$SECONDS
	if ! (cd "$moddir" && nice -n 10 "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$tmp" "$pkg"); then
		rm -f "$tmp"
		echo "kube-bins: building $name failed" >&2
		exit 1
	fi
	mv -f "$tmp" "$dir/$name"
	echo "kube-bins: built $name in $((SECONDS - start)) s" >&2
}

# The version kube-apiserver reports (/version, --version) is stamped at
# build time, as the Kubernetes release build does.
minor=${k8s#v1.}
minor=${minor%%.*}
vflags=
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	vflags+=" -X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.gitCommit="
done

build etcd "$etcd" "about 1 min" tools/kube/etcd .
build kube-apiserver "$k8s" "about 5 min" tools/kube/apiserver k8s.io/kubernetes/cmd/kube-apiserver "$vflags"
echo "$dir"
