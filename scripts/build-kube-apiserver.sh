#!/usr/bin/env bash
# The kube-apiserver built from Debian's own `kubernetes` source package and cached outside the repository, keyed by
# the Debian source version (scripts/build-kubernetes.sh); prints the path of the binary on stdout.
exec "$(dirname "$0")/build-kubernetes.sh" kube-apiserver
