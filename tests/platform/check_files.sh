#!/usr/bin/env bash
# check_files.sh - the files that install and deploy ratelimitd, checked
# without a systemd PID 1, a Docker engine or a Kubernetes cluster.
#
# The systemd unit, the Dockerfile, the Kubernetes example and `make
# install` are what operators copy; nothing else runs them, so a typo in
# one ships unnoticed.  Each is checked here as far as this machine allows:
#   - systemd/ratelimitd.service: `systemd-analyze verify` on a copy whose
#     ExecStart/ExecStartPre point at $RATELIMITD_BIN (the shipped path does
#     not exist here) and whose Documentation= finds docs/man, and the
#     directives the daemon's behaviour depends on;
#   - Dockerfile: every COPY source exists in a clean clone of HEAD; the
#     build stage's RUN commands (apt-get aside: the packages are installed
#     here) succeed in a directory holding only what the stage COPYs; the
#     runtime stage installs the libraries the binary needs, runs as a
#     non-root USER, has a HEALTHCHECK on /healthz, reads
#     /etc/ratelimitd/ratelimitd.yaml, and listens on 0.0.0.0 only through
#     its ENV;
#   - conf/ratelimitd.yaml and the ConfigMap in deploy/kubernetes pass
#     `ratelimitd --check`; the pod has a native sidecar with probes that
#     can reach the daemon;
#   - `make install DESTDIR=... PREFIX=/usr` from the clone installs the
#     binary, the config, the unit (pointing at /usr/sbin) and the manual
#     page, which renders without warnings.
# One line per check, then "N passed, M failed"; exits 1 if M > 0.
#
# Environment: RATELIMITD_BIN (the built daemon, absolute path) and
# RATELIMITD_SRCDIR (the repository root), as `make integration` sets them.
set -euo pipefail

: "${RATELIMITD_BIN:?set RATELIMITD_BIN to the built daemon}"
: "${RATELIMITD_SRCDIR:?set RATELIMITD_SRCDIR to the repository root}"
src=$RATELIMITD_SRCDIR
bin=$RATELIMITD_BIN
# Under `make integration` these carry the outer make's options (say
# SANITIZER=address) into the builds below, which must be plain ones.
unset MAKEFLAGS MAKELEVEL MFLAGS MAKEOVERRIDES SANITIZER BUILD
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rl-platform-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

. "$src/tests/platform/lib/check.sh"

# --- the systemd unit -------------------------------------------------------

unit=$src/systemd/ratelimitd.service

unit_verifies() {
  local copy=$tmp/unit/ratelimitd.service out rc=0
  mkdir -p "$tmp/unit" "$tmp/man/man8"
  cp "$src/docs/man/ratelimitd.8" "$tmp/man/man8/"
  # Only the binary's path changes; systemd checks that it is executable.
  sed -E "s#^(ExecStart(Pre)?=[-@:+!]*)[^ ]*ratelimitd#\1$bin#" \
    "$unit" >"$copy"
  if ! grep -q "^ExecStart=$bin " "$copy"; then
    echo "ExecStart= does not name a ratelimitd binary"
    return 1
  fi
  out=$(MANPATH=$tmp/man systemd-analyze verify "$copy" 2>&1) || rc=$?
  # Only what concerns our unit counts; anything else is the machine's.
  if [ "$rc" -ne 0 ] || grep -q 'ratelimitd' <<<"$out"; then
    printf '%s\n' "$out"
    return 1
  fi
  if [ -n "$out" ]; then
    printf 'note: %s\n' "$out"
  fi
}

# unit_has REGEX DESCRIPTION: an uncommented line of the unit matches.
unit_has() {
  if ! grep -Eq "$1" "$unit"; then
    echo "no line matching /$1/: $2"
    return 1
  fi
}

check "systemd-analyze verify systemd/ratelimitd.service" unit_verifies
check "unit: Type=notify (the daemon sends READY=1)" \
  unit_has '^Type=notify$' "the daemon reports READY=1 itself"
check "unit: ExecReload sends SIGHUP" \
  unit_has '^ExecReload=.*kill .*-(HUP|SIGHUP|s HUP) ' "reload is SIGHUP"
check "unit: DynamicUser=yes or User=" \
  unit_has '^(DynamicUser=yes|User=[^r].*)$' "never root"
check "unit: NoNewPrivileges=yes" unit_has '^NoNewPrivileges=yes$' ""
check "unit: ProtectSystem=strict" unit_has '^ProtectSystem=strict$' ""
check "unit: PrivateTmp=yes" unit_has '^PrivateTmp=yes$' ""

# --- the Dockerfile ---------------------------------------------------------

git clone -q "$src" "$tmp/clone"
clone=$tmp/clone

# The Dockerfile as logical instructions, one a line: "STAGE KEYWORD REST",
# comments dropped, continuation lines joined, stages numbered from 0.
awk '
  /^[[:space:]]*#/ { next }
  { line = line $0 }
  /\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, " ", line); next }
  line ~ /[^[:space:]]/ {
    sub(/^[[:space:]]+/, "", line)
    kw = toupper(line); sub(/[[:space:]].*/, "", kw)
    if (kw == "FROM") stage++
    rest = line; sub(/^[^[:space:]]+[[:space:]]*/, "", rest)
    gsub(/[[:space:]]+/, " ", rest)
    print stage - 1, kw, rest
  }
  { line = "" }
' "$src/Dockerfile" >"$tmp/dockerfile"
last_stage=$(awk 'END { print $1 }' "$tmp/dockerfile")

# instr STAGE KEYWORD: the REST of each such instruction, one a line.
instr() {
  awk -v s="$1" -v k="$2" '$1 == s && $2 == k {
    sub(/^[^ ]+ [^ ]+ ?/, ""); print }' "$tmp/dockerfile"
}

# COPY [--flags] SRC... DEST, split into words (no JSON form).
copy_words() {
  local rest=$1
  if [[ $rest == \[* ]]; then
    echo "COPY $rest: the JSON form is not handled here" >&2
    return 1
  fi
  # shellcheck disable=SC2086
  printf '%s\n' $rest
}

dockerfile_copy_sources_exist() {
  local stage rest w missing=0 n=0
  local -a words
  for ((stage = 0; stage <= last_stage; stage++)); do
    while IFS= read -r rest; do
      mapfile -t words < <(copy_words "$rest")
      [[ ${words[0]} == --from=* ]] && continue
      words=("${words[@]/#--*/}")
      for w in "${words[@]:0:${#words[@]}-1}"; do
        [ -z "$w" ] && continue
        n=$((n + 1))
        if [ ! -e "$clone/$w" ]; then
          echo "COPY $w: not in a clean clone of HEAD"
          missing=1
        fi
      done
    done < <(instr "$stage" COPY)
  done
  [ "$n" -gt 0 ] || { echo "no COPY found"; return 1; }
  return "$missing"
}

# The build stages, run here: each in $tmp/stage<N> (standing for the
# container's /), holding only what the stage COPYs from the clone.
dockerfile_build_stage_runs() {
  local stage kw rest workdir root dest w cmd
  local -a words
  for ((stage = 0; stage < last_stage; stage++)); do
    root=$tmp/stage$stage
    workdir=/
    mkdir -p "$root"
    while read -r _ kw rest; do
      case $kw in
      WORKDIR)
        case $rest in
        /*) workdir=$rest ;;
        *) workdir=$workdir/$rest ;;
        esac
        mkdir -p "$root$workdir"
        ;;
      COPY)
        mapfile -t words < <(copy_words "$rest")
        if [[ ${words[0]} == --* ]]; then
          echo "COPY $rest: flags are not handled in a build stage"
          return 1
        fi
        dest=${words[-1]}
        [[ $dest == /* ]] || dest=$workdir/$dest
        for w in "${words[@]:0:${#words[@]}-1}"; do
          if [ ! -e "$clone/$w" ]; then
            echo "COPY $w: not in the clone; the build would stop here"
            return 1
          elif [ -d "$clone/$w" ]; then
            mkdir -p "$root$dest"
            cp -a "$clone/$w/." "$root$dest/"
          elif [[ $dest == */ ]] || [ ${#words[@]} -gt 2 ]; then
            mkdir -p "$root$dest"
            cp -a "$clone/$w" "$root$dest/"
          else
            mkdir -p "$(dirname "$root$dest")"
            cp -a "$clone/$w" "$root$dest"
          fi
        done
        ;;
      RUN)
        cmd=$rest
        if [[ $cmd == *apt-get* ]]; then
          echo "note: skipped (packages installed here): ${cmd:0:60}..."
          continue
        fi
        echo "note: stage $stage, in $workdir: $cmd"
        if ! (cd "$root$workdir" && sh -c "$cmd") </dev/null \
          >"$tmp/stage$stage.log" 2>&1; then
          tail -n 30 "$tmp/stage$stage.log"
          echo "RUN $cmd failed in a context of only the COPYed files"
          return 1
        fi
        ;;
      esac
    done < <(awk -v s="$stage" '$1 == s' "$tmp/dockerfile")
  done
  # What the runtime stage takes from the build stages must be there.
  while IFS= read -r rest; do
    mapfile -t words < <(copy_words "$rest")
    [[ ${words[0]} == --from=* ]] || continue
    w=${words[1]}
    if ! compgen -G "$tmp/stage*$w" >/dev/null; then
      echo "COPY ${words[0]} $w: the build stage did not produce it"
      return 1
    fi
  done < <(instr "$last_stage" COPY)
}

# The image's binary: what `COPY --from=...` takes from the build stage.
image_bin() {
  local rest
  rest=$(instr "$last_stage" COPY | grep -- '--from=' | grep ratelimitd |
    head -n1)
  # shellcheck disable=SC2086
  set -- $rest
  compgen -G "$tmp/stage*$2" | head -n1
}

# The packages the runtime stage's apt-get install names.
runtime_packages() {
  instr "$last_stage" RUN | grep 'apt-get' |
    sed -n 's/.*apt-get install \([^&]*\).*/\1/p' | tr ' ' '\n' |
    grep -v '^-' | grep -v '^$' || true
}

dockerfile_runtime_libraries() {
  local img lib path pkg pkgs bad=0
  img=$(image_bin) || true
  if [ -z "$img" ] || [ ! -x "$img" ]; then
    echo "the build stage's binary is missing"
    return 1
  fi
  pkgs=$(runtime_packages)
  for lib in $(objdump -p "$img" | awk '/NEEDED/ { print $2 }'); do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')
    pkg=$( (dpkg -S "$path" 2>/dev/null ||
      dpkg -S "$(readlink -f "$path")" 2>/dev/null) | head -n1 |
      cut -d: -f1)
    case $pkg in
    libc6 | "") continue ;; # in debian:bookworm-slim already
    esac
    if ! grep -qx "$pkg" <<<"$pkgs"; then
      echo "$lib comes from $pkg, which the runtime stage does not install"
      bad=1
    fi
  done
  return "$bad"
}

dockerfile_user() {
  local user
  user=$(instr "$last_stage" USER | tail -n1)
  case ${user%%:*} in
  "")
    echo "the runtime stage has no USER: it runs as root"
    return 1
    ;;
  root | 0)
    echo "USER $user is root"
    return 1
    ;;
  esac
  echo "note: USER $user"
}

dockerfile_healthcheck() {
  local hc tool
  hc=$(instr "$last_stage" HEALTHCHECK | tail -n1)
  if [[ $hc != *CMD*/healthz* ]]; then
    echo "no HEALTHCHECK ... CMD ... /healthz in the runtime stage: $hc"
    return 1
  fi
  tool=${hc#*CMD }
  tool=${tool%% *}
  tool=${tool//[\[\]\",]/}
  if ! runtime_packages | grep -qx "$tool"; then
    echo "the HEALTHCHECK runs $tool, which the runtime stage does not install"
    return 1
  fi
}

dockerfile_config_path() {
  local path=/etc/ratelimitd/ratelimitd.yaml run
  if ! instr "$last_stage" COPY | grep -q " $path\$"; then
    echo "no COPY ... $path in the runtime stage"
    return 1
  fi
  run="$(instr "$last_stage" ENTRYPOINT) $(instr "$last_stage" CMD)"
  if [[ $run == *'"-c"'* || $run == *' -c '* ]] && [[ $run != *$path* ]]; then
    echo "ENTRYPOINT/CMD pass -c, but not $path: $run"
    return 1
  fi
}

# The image's binary accepts the image's config (both from HEAD).
dockerfile_config_checks() {
  local img
  img=$(image_bin) || true
  [ -n "$img" ] || { echo "the build stage's binary is missing"; return 1; }
  "$img" --check -c "$clone/conf/ratelimitd.yaml"
}

any_address_only_in_env() {
  local bad=0 line kw
  while IFS= read -r line; do
    read -r _ kw _ <<<"$line"
    if [ "$kw" != ENV ]; then
      echo "Dockerfile: 0.0.0.0 outside ENV: ${line#* }"
      bad=1
    fi
  done < <(grep -F '0.0.0.0' "$tmp/dockerfile" || true)
  if ! grep -q '^[0-9]* ENV .*RATELIMITD_LISTEN=0\.0\.0\.0:' \
    "$tmp/dockerfile"; then
    echo "Dockerfile: no ENV RATELIMITD_LISTEN=0.0.0.0:PORT"
    bad=1
  fi
  if sed 's/#.*//' "$src/conf/ratelimitd.yaml" | grep -qF '0.0.0.0'; then
    echo "conf/ratelimitd.yaml listens on 0.0.0.0; keep it on loopback"
    bad=1
  fi
  return "$bad"
}

# EXPOSE, the ENV listen address and the HEALTHCHECK agree on the port.
dockerfile_one_port() {
  local expose listen hc
  expose=$(instr "$last_stage" EXPOSE | head -n1)
  expose=${expose%%/*}
  listen=$(sed -n 's/.*RATELIMITD_LISTEN=[^ ]*:\([0-9]*\).*/\1/p' \
    "$tmp/dockerfile" | head -n1)
  hc=$(instr "$last_stage" HEALTHCHECK |
    sed -n 's#.*:\([0-9]*\)/healthz.*#\1#p')
  if [ -z "$expose" ] || [ "$expose" != "$listen" ] || [ "$hc" != "$listen" ]
  then
    echo "EXPOSE $expose, RATELIMITD_LISTEN port $listen, HEALTHCHECK port $hc"
    return 1
  fi
}

check "Dockerfile: every COPY source is in a clean clone of HEAD" \
  dockerfile_copy_sources_exist
check "Dockerfile: the build stage builds from only what it COPYs" \
  dockerfile_build_stage_runs
check "Dockerfile: the runtime stage installs the libraries the binary needs" \
  dockerfile_runtime_libraries
check "Dockerfile: the runtime stage runs as a non-root USER" dockerfile_user
check "Dockerfile: HEALTHCHECK on /healthz with an installed tool" \
  dockerfile_healthcheck
check "Dockerfile: config at /etc/ratelimitd/ratelimitd.yaml" \
  dockerfile_config_path
check "Dockerfile: the image's binary accepts the image's config" \
  dockerfile_config_checks
check "0.0.0.0 only in the Dockerfile's ENV, not in conf/ratelimitd.yaml" \
  any_address_only_in_env
check "Dockerfile: EXPOSE, listen port and HEALTHCHECK agree" \
  dockerfile_one_port

# --- configuration files -----------------------------------------------------

k8s=$src/deploy/kubernetes/ratelimitd.yaml

# The ConfigMap's "ratelimitd.yaml: |" block, its indentation removed.
awk '
  done { next }
  inblock {
    if ($0 ~ /^[[:space:]]*$/) { print ""; next }
    match($0, /^ */)
    if (RLENGTH <= key) { done = 1; next }
    if (ind < 0) ind = RLENGTH
    print substr($0, ind + 1)
    next
  }
  /^ *ratelimitd\.yaml: *\|/ { match($0, /^ */); key = RLENGTH; ind = -1
    inblock = 1 }
' "$k8s" >"$tmp/configmap.yaml"

check_config() {
  if [ ! -s "$1" ]; then
    echo "$1: empty"
    return 1
  fi
  "$bin" --check -c "$1"
}

check "ratelimitd --check conf/ratelimitd.yaml" \
  check_config "$src/conf/ratelimitd.yaml"
check "ratelimitd --check on the ConfigMap's ratelimitd.yaml" \
  check_config "$tmp/configmap.yaml"

# --- Kubernetes --------------------------------------------------------------

k8s_native_sidecar() {
  if ! awk '/^ *initContainers:/ { init = 1 } /^  containers:/ { init = 0 }
    init && /^ *restartPolicy: *Always *$/ { found = 1 }
    END { exit !found }' "$k8s"; then
    echo "no initContainers entry with restartPolicy: Always"
    return 1
  fi
}

# probe_path NAME: the path the probe called NAME asks for.
probe_path() {
  awk -v p="$1:" '$1 == p { on = 1; next }
    on && match($0, /\/[a-z]+z/) { print substr($0, RSTART, RLENGTH); exit }
    on && /^ *[a-zA-Z]+Probe:/ { exit }' "$k8s"
}

k8s_probes() {
  local live ready bad=0
  live=$(probe_path livenessProbe)
  ready=$(probe_path readinessProbe)
  if [ "$live" != /healthz ]; then
    echo "livenessProbe asks ${live:-nothing}, expected /healthz"
    bad=1
  fi
  if [ "$ready" != /readyz ]; then
    echo "readinessProbe asks ${ready:-nothing}, expected /readyz"
    bad=1
  fi
  return "$bad"
}

# The kubelet's httpGet probes go to the pod IP: a daemon listening on
# loopback only must be probed from inside the container.
k8s_probes_reach() {
  local listen
  listen=$(grep -A1 'name: RATELIMITD_LISTEN' "$k8s" |
    sed -n 's/.*value: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' | head -n1)
  if [ -z "$listen" ]; then
    listen=$(grep -m1 '^ *listen:' "$tmp/configmap.yaml" |
      sed 's/.*listen: *"\{0,1\}\([^"]*\)"\{0,1\}.*/\1/')
  fi
  case $listen in
  127.* | localhost:* | "[::1]:"* | unix:*)
    if sed 's/#.*//' "$k8s" | grep -q 'httpGet:'; then
      echo "the daemon listens on $listen, but httpGet probes go to the"
      echo "pod IP: use exec probes (curl http://$listen/...)"
      return 1
    fi
    ;;
  esac
  echo "note: listens on ${listen:-?}"
}

k8s_paths_agree() {
  local bad=0 user
  grep -q 'mountPath: /etc/ratelimitd$' "$k8s" ||
    { echo "the ConfigMap is not mounted at /etc/ratelimitd"; bad=1; }
  grep -q '"-c", "/etc/ratelimitd/ratelimitd.yaml"' "$k8s" ||
    { echo "args do not name /etc/ratelimitd/ratelimitd.yaml"; bad=1; }
  user=$(instr "$last_stage" USER | tail -n1)
  grep -q "runAsUser: ${user%%:*}\$" "$k8s" ||
    { echo "runAsUser differs from the image's USER $user"; bad=1; }
  return "$bad"
}

check "kubernetes: a native sidecar (init container, restartPolicy: Always)" \
  k8s_native_sidecar
check "kubernetes: livenessProbe /healthz, readinessProbe /readyz" k8s_probes
check "kubernetes: the probes can reach the daemon's listen address" \
  k8s_probes_reach
check "kubernetes: mount path, -c and runAsUser agree with the image" \
  k8s_paths_agree

# --- make install -----------------------------------------------------------

root=$tmp/root

make_install() {
  if ! make -C "$clone" install DESTDIR="$root" PREFIX=/usr \
    >"$tmp/install.log" 2>&1; then
    tail -n 30 "$tmp/install.log"
    return 1
  fi
  local f bad=0
  for f in usr/sbin/ratelimitd etc/ratelimitd/ratelimitd.yaml \
    usr/lib/systemd/system/ratelimitd.service \
    usr/share/man/man8/ratelimitd.8; do
    [ -f "$root/$f" ] || { echo "not installed: /$f"; bad=1; }
  done
  [ -x "$root/usr/sbin/ratelimitd" ] ||
    { echo "/usr/sbin/ratelimitd is not executable"; bad=1; }
  return "$bad"
}

installed_unit() {
  local u=$root/usr/lib/systemd/system/ratelimitd.service bad=0
  [ -f "$u" ] || { echo "no installed unit"; return 1; }
  local want='^ExecStart=/usr/sbin/ratelimitd -c /etc/ratelimitd/'
  if ! grep -q "${want}ratelimitd.yaml\$" "$u"; then
    echo "ExecStart: $(grep '^ExecStart=' "$u")"
    bad=1
  fi
  grep -q '^ExecStartPre=/usr/sbin/ratelimitd --check ' "$u" ||
    { echo "ExecStartPre: $(grep '^ExecStartPre=' "$u")"; bad=1; }
  if grep -n '/usr/local' "$u"; then
    echo "the installed unit still names /usr/local"
    bad=1
  fi
  return "$bad"
}

man_renders() {
  local page=$root/usr/share/man/man8/ratelimitd.8 err
  [ -f "$page" ] || { echo "no installed page"; return 1; }
  # man-db and groff-base are in the Makefile's DEPS_TEST: a missing one
  # fails here rather than passing unchecked.
  command -v man >/dev/null ||
    { echo "man is not installed (make deps WITH_TEST_DEPS=1: man-db)"; return 1; }
  command -v groff >/dev/null ||
    { echo "groff is not installed (make deps WITH_TEST_DEPS=1: groff-base)"; return 1; }
  err=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) ||
    { echo "man -l failed: $err"; return 1; }
  [ -z "$err" ] || { printf 'man -l: %s\n' "$err"; return 1; }
  err=$(groff -man -Tutf8 -ww -z "$page" 2>&1) ||
    { echo "groff failed: $err"; return 1; }
  [ -z "$err" ] || { printf 'groff -ww: %s\n' "$err"; return 1; }
}

check "make install DESTDIR=... PREFIX=/usr (from a clean clone)" make_install
check "installed unit runs /usr/sbin/ratelimitd" installed_unit
check "installed ratelimitd(8) renders without warnings" man_renders

check_done
