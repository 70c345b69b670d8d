#!/usr/bin/env bash
# Build kube-apiserver and kube-controller-manager 1.20.2 from Debian bookworm's
# source package (vendored deps, offline build with Debian's golang-1.19), and
# unpack etcd-server. Everything lives in a cache folder outside the repo; no
# system-wide install. Idempotent: exits early when the binaries are cached.
#
#   tests/cluster/build.sh            # prints the bin directory on the last line
#   LLMDEPLOY_KUBE_CACHE=/some/dir tests/cluster/build.sh
set -euo pipefail

CACHE="${LLMDEPLOY_KUBE_CACHE:-$HOME/.cache/llmdeploy/kube-1.20.2}"
BIN="$CACHE/bin"
WANT=(kube-apiserver kube-controller-manager etcd)

# Bump when the build recipe changes, so cached binaries from an older recipe are rebuilt.
BUILD_ID="kube-1.20.2+reflect2-1.0.2"
have_all() {
  local b
  for b in "${WANT[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  [[ "$(cat "$BIN/BUILD_ID" 2>/dev/null)" == "$BUILD_ID" ]]
}
if have_all; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE"/{apt/lists/partial,apt/archives/partial,apt/parts,debs,root,src} "$BIN"

# Private apt configuration: same Debian mirror as the system, plus deb-src.
SOURCES="$CACHE/apt/sources.list"
MIRROR="$(awk '/^URIs:/ && $2 ~ /debian$/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
cat > "$SOURCES" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR bookworm main
SRC
APT_OPTS=(
  -o "Dir::Etc::SourceList=$SOURCES"
  -o "Dir::Etc::SourceParts=$CACHE/apt/parts"
  -o "Dir::State::Lists=$CACHE/apt/lists"
  -o "Dir::Cache::Archives=$CACHE/apt/archives"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  -o "APT::Sandbox::User=root"
)
if [[ ! -f "$CACHE/apt/.updated" ]]; then
  apt-get "${APT_OPTS[@]}" update
  touch "$CACHE/apt/.updated"
fi

# Binary packages: Go toolchain and etcd, unpacked with dpkg -x.
cd "$CACHE/debs"
for pkg in golang-1.19-go golang-1.19-src etcd-server golang-github-modern-go-reflect2-dev; do
  ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get "${APT_OPTS[@]}" download "$pkg"
done
if [[ ! -x "$CACHE/root/usr/lib/go-1.19/bin/go" || ! -x "$CACHE/root/usr/bin/etcd" \
      || ! -d "$CACHE/root/usr/share/gocode/src/github.com/modern-go/reflect2" ]]; then
  for deb in "$CACHE"/debs/*.deb; do dpkg -x "$deb" "$CACHE/root"; done
fi
ETCD="$CACHE/root/usr/bin/etcd"
[[ -x "$ETCD" ]] || ETCD="$(find "$CACHE/root" -name etcd -type f -perm -u+x | head -n1)"
install -m 0755 "$ETCD" "$BIN/etcd"

# Source package: fetch without building, unpack with dpkg-source.
cd "$CACHE/src"
if ! ls -d kubernetes-*/ >/dev/null 2>&1; then
  apt-get "${APT_OPTS[@]}" source --download-only kubernetes
  if command -v dpkg-source >/dev/null 2>&1; then
    dpkg-source --no-check -x kubernetes_*.dsc
  else  # no dpkg-dev: unpack by hand and apply Debian's patch series
    orig="$(ls kubernetes_*.orig.tar.* | head -n1)"
    dir="kubernetes-$(basename "$orig" | sed -e 's/^kubernetes_//' -e 's/\.orig\.tar\..*$//')"
    mkdir -p "$dir"
    tar -xf "$orig" -C "$dir" --strip-components=1
    tar -xf "$(ls kubernetes_*.debian.tar.* | head -n1)" -C "$dir"
    if [[ -f "$dir/debian/patches/series" ]]; then
      grep -v '^\s*#' "$dir/debian/patches/series" | while read -r patch; do
        [[ -n "$patch" ]] && patch -d "$dir" -p1 --quiet < "$dir/debian/patches/$patch"
      done
    fi
  fi
fi
SRCDIR="$(ls -d "$CACHE"/src/kubernetes-*/ | head -n1)"

# Kubernetes 1.20 vendors reflect2 1.0.1, whose unsafe map iteration crashes the API server
# (SIGSEGV in json-iterator, e.g. on the first custom resource) when built with Go >= 1.18.
# Debian's reflect2 1.0.2 fixes that and keeps the API; swap it into the vendor folder.
R2_VENDOR="$SRCDIR/vendor/github.com/modern-go/reflect2"
R2_DEBIAN="$CACHE/root/usr/share/gocode/src/github.com/modern-go/reflect2"
if [[ ! -f "$R2_VENDOR/.llmdeploy-1.0.2" ]]; then
  rm -rf "$R2_VENDOR"
  mkdir -p "$R2_VENDOR"
  cp -r "$R2_DEBIAN"/. "$R2_VENDOR"/
  rm -rf "$R2_VENDOR"/test* "$R2_VENDOR"/*_test.go
  touch "$R2_VENDOR/.llmdeploy-1.0.2"
  rm -f "$BIN/kube-apiserver" "$BIN/kube-controller-manager"
fi

export GOROOT="$CACHE/root/usr/lib/go-1.19"
export PATH="$GOROOT/bin:$PATH"
export GOCACHE="$CACHE/gocache" GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
unset GOFLAGS
# The Makefile runs Kubernetes' code generators (openapi, deepcopy, ...) before
# compiling, as Debian's own build does; GOPATH mode with the vendor folder.
export GOPATH="$SRCDIR/.go"
mkdir -p "$GOPATH/src/k8s.io"
[[ -L "$GOPATH/src/k8s.io/kubernetes" ]] || ln -s ../../.. "$GOPATH/src/k8s.io/kubernetes"
VERSION_FILE="$CACHE/version.env"
cat > "$VERSION_FILE" <<VER
KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_VERSION='v1.20.2'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
VER
export KUBE_GIT_VERSION_FILE="$VERSION_FILE"
# Keep the build gentle on a shared machine unless told otherwise.
export GOMAXPROCS="${GOMAXPROCS:-2}"
# hack/lib/golang.sh places binaries with `rsync -pc SRC DEST`; rsync is not
# always installed, so provide a cp-based stand-in for exactly that use.
mkdir -p "$CACHE/shim"
if ! command -v rsync >/dev/null 2>&1; then
  cat > "$CACHE/shim/rsync" <<'SHIM'
#!/usr/bin/env bash
args=(); for a in "$@"; do [[ "$a" == -* ]] || args+=("$a"); done
exec cp -p "${args[@]}"
SHIM
  chmod +x "$CACHE/shim/rsync"
  export PATH="$CACHE/shim:$PATH"
fi
cd "$SRCDIR"
rm -f _output/bin/*-gen  # empty leftovers from a build without rsync
need=()
for b in kube-apiserver kube-controller-manager; do
  [[ -x "$BIN/$b" ]] || need+=("cmd/$b")
done
if (( ${#need[@]} )); then
  env HOME="$CACHE/home" make WHAT="${need[*]}" GOLDFLAGS="-s -w" GOFLAGS="-p=$GOMAXPROCS"
  for b in "${need[@]}"; do
    install -m 0755 "_output/local/bin/linux/amd64/${b#cmd/}" "$BIN/${b#cmd/}"
  done
fi
echo "$BUILD_ID" > "$BIN/BUILD_ID"
have_all
echo "$BIN"
