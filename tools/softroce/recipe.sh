#!/bin/bash
# dmkit's Soft-RoCE guest: boots a throw-away QEMU guest (TCG) running a stock Debian kernel
# that ships rdma_rxe.ko from a tiny busybox initramfs, brings up rxe0 on a dummy interface,
# runs dmkit's own binaries there (tools/softroce/guest_test.sh) and powers off.
# Adapted from the workplace's reference tool (../shared/tools/softroce); tools/softroce/run.sh
# is the entry point that builds dmkit with the verbs feature and calls this script.
#
# usage: recipe.sh [setup|build|run|all]   (default: all)
#   setup : apt-get the host tools and the Debian kernel .deb (one-time, ~89 MB download)
#   build : build base initramfs (busybox + rxe modules + rdma userspace) + test overlay
#   run   : boot guest, run tests, power off; exit status = guest test status
# env: W (work dir), ACCEL (default tcg), GUEST_TEST (guest script), EXTRA_BINS (host binaries
#      copied with their shared libraries into the guest, linked under /usr/local/bin)
set -euo pipefail
W=${W:-${TMPDIR:-/tmp}/softroce-work}
ACCEL=${ACCEL:-tcg}        # 'kvm' does NOT work on this VM (kvm_pvm backend, see report)
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W"; cd "$W"

setup() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # qemu + busybox for the guest; rdma-core userspace is copied from the host install into the guest;
  # libibverbs-dev/gcc only needed to build the verbs test program.
  apt-get install -y -qq --no-install-recommends qemu-system-x86 busybox-static cpio kmod iproute2 \
      rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest libibverbs-dev libclang-dev clang gcc libc6-dev python3 >/dev/null
  # Debian kernel with CONFIG_RDMA_RXE=m (same kernel as linux-image-amd64 depends on)
  local kpkg; kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  mkdir -p dl; (cd dl && rm -f linux-image-*.deb && apt-get download -qq "$kpkg" 2>/dev/null)
  rm -rf kpkg; dpkg -x dl/"$kpkg"_*.deb kpkg
  local KV; KV=$(ls kpkg/lib/modules); depmod -b kpkg "$KV"   # .deb ships no modules.dep
  cp kpkg/boot/vmlinuz-"$KV" vmlinuz
  # uncompressed ELF vmlinux (has a PVH entry note): lets QEMU skip BIOS + in-guest xz decompression,
  # which halves the boot time under TCG
  python3 -c 'import lzma,sys; d=open("vmlinuz","rb").read(); i=d.find(b"\xfd7zXZ\x00"); open("vmlinux","wb").write(lzma.LZMADecompressor().decompress(d[i:]))'
}

copy_with_libs() {  # root, files...  (copies ELF files + their shared libs into root)
  local R=$1; shift
  for b in "$@"; do mkdir -p "$R$(dirname "$b")"; rm -f "$R$b"; cp -L "$b" "$R$b"; done
  for l in $(ldd "$@" 2>/dev/null | awk '$2=="=>" && $3 ~ /^\//{print $3} $1 ~ /^\/.*ld-linux/{print $1}' | sort -u); do
    [ -e "$R$l" ] || [ -e "$W/base$l" ] || { mkdir -p "$R$(dirname "$l")"; cp -L "$l" "$R$l"; }
  done
}

build_base() {
  local KV; KV=$(ls kpkg/lib/modules); local KM=kpkg/lib/modules/$KV R=$W/base
  rm -rf "$R"; mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,usr/local/bin,lib/modules/"$KV"}
  cp /bin/busybox "$R"/bin/busybox
  for a in $("$R"/bin/busybox --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done
  # kernel modules + deps (crc32_generic is a runtime crypto dep of rdma_rxe not listed in modules.dep)
  local mods="" m line f
  for m in rdma_rxe ib_uverbs ib_umad rdma_ucm dummy crc32_generic virtio_pci virtio_net; do
    line=$(grep -E "/$m\.ko(\.xz|\.zst)?:" "$KM"/modules.dep); mods="$mods ${line%%:*} ${line#*:}"
  done
  for f in $(echo $mods | tr ' ' '\n' | sort -u); do mkdir -p "$R/lib/modules/$KV/$(dirname "$f")"; cp "$KM/$f" "$R/lib/modules/$KV/$f"; done
  cp "$KM"/modules.order "$KM"/modules.builtin* "$R/lib/modules/$KV/"; depmod -b "$R" "$KV"
  # rdma userspace from the host's Debian packages; rxe provider is dlopen()ed; libgcc_s for pthread_exit
  local PROV=/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
  copy_with_libs "$R" /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/rping \
      /usr/bin/ib_read_lat /usr/bin/ib_write_lat /usr/bin/ib_atomic_lat /usr/bin/ib_atomic_bw \
      /usr/bin/ib_read_bw /usr/bin/ib_write_bw /usr/bin/rdma /bin/ip $PROV /lib/x86_64-linux-gnu/libgcc_s.so.1
  mkdir -p "$R"/etc/libibverbs.d; cp /etc/libibverbs.d/rxe.driver "$R"/etc/libibverbs.d/
  echo "127.0.0.1 localhost" > "$R"/etc/hosts; echo "root:x:0:0:root:/root:/bin/sh" > "$R"/etc/passwd
  cat > "$R"/init <<'EOF'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
echo "GUEST_INIT_UPTIME=$(cut -d' ' -f1 /proc/uptime)"
dmesg -n 3
# Soft-RoCE on a dummy netdev: rxe loops back packets whose dest MAC is its own, nothing hits a wire
ip link set lo up
# dmkit.ip=A.B.C.D on the kernel command line (tools/softroce/multi.sh): one host of several, rxe0
# on the guest's virtio NIC, whose frames reach the other guests only through `dmkit switch`.
# Otherwise the single-guest setup: rxe0 on a dummy netdev.
for kv in $(cat /proc/cmdline); do case "$kv" in dmkit.*=*) k=${kv%%=*}; k=${k#dmkit.}; export "DMKIT_GUEST_$k=${kv#*=}";; esac; done
if [ -n "${DMKIT_GUEST_ip:-}" ]; then
  modprobe virtio_pci && modprobe virtio_net
  NIC=eth0; ip link set $NIC up && ip addr add "$DMKIT_GUEST_ip/24" dev $NIC
else
  NIC=dum0; modprobe dummy && ip link add dum0 type dummy && ip link set dum0 up && ip addr add 10.77.0.1/24 dev dum0
fi
modprobe crc32_generic && modprobe rdma_rxe && modprobe ib_uverbs && modprobe rdma_ucm
rdma link add rxe0 type rxe netdev $NIC
rdma link show; ibv_devices
# GID index of the IPv4-mapped (RoCEv2) GID
GIDX=$(for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
  case "$(cat $g)" in 0000:0000:0000:0000:0000:ffff:*) basename $g; break;; esac; done)
export GIDX=${GIDX:-1}; echo "RoCEv2 IPv4 GID index: $GIDX"
sh /guest_test.sh; rc=$?
echo "GUEST_TEST_EXIT=$rc GUEST_END_UPTIME=$(cut -d' ' -f1 /proc/uptime)"
# report status to the host via isa-debug-exit (qemu exit code = (rc<<1)|1)
printf "\\$(printf %o $rc)" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
poweroff -f
EOF
  chmod +x "$R"/init
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) > base.cpio.gz
}

build_overlay() {  # guest test script + extra project binaries: a 2nd cpio appended to the initrd
  local O=$W/overlay; rm -rf "$O"; mkdir -p "$O"/usr/local/bin
  cp "${GUEST_TEST:-$HERE/guest_test.sh}" "$O"/guest_test.sh
  for b in ${EXTRA_BINS:-}; do copy_with_libs "$O" "$b"; mkdir -p "$O"/usr/local/bin; ln -sf "$b" "$O/usr/local/bin/$(basename "$b")"; done
  (cd "$O" && find . | cpio -o -H newc --quiet | gzip -1) > overlay.cpio.gz
  cat base.cpio.gz overlay.cpio.gz > initrd.img
}

run_guest() {
  local rc=0 cpu=""
  [ "$ACCEL" = kvm ] && cpu="-cpu host,-arch-capabilities"
  # default: pc + PVH direct boot of the ELF vmlinux (no in-guest decompression, ~3.5 s total);
  # BOOT=bzimage: pc + SeaBIOS + compressed vmlinuz (~7 s). (-M microvm is ~0.3 s faster but hung in
  # 2/5 boots under TCG: "tsc: Unable to calibrate against PIT", so it is not used.)
  local mach="-M pc -kernel vmlinux"; [ "${BOOT:-pvh}" = bzimage ] && mach="-M pc -kernel vmlinuz"
  timeout ${TIMEOUT:-900} qemu-system-x86_64 $mach -accel "$ACCEL" $cpu -smp ${SMP:-2} -m ${MEM:-3G} \
    -nographic -nodefaults -serial stdio -no-reboot -initrd initrd.img \
    -append "console=ttyS0 quiet panic=-1" \
    -device isa-debug-exit,iobase=0xf4,iosize=0x04 | tee guest.log || rc=$?
  # rc 1 = guest test exit 0; rc (2n+1) = guest exit n; rc 0 = guest powered off without reporting
  if [ $rc -eq 1 ]; then echo "HOST: guest tests PASSED"; return 0; fi
  echo "HOST: guest tests FAILED (qemu rc=$rc)"; return 1
}

case "${1:-all}" in
  setup) setup;; build) build_base; build_overlay;; run) run_guest;;
  all) [ -e vmlinuz ] || setup; build_base; build_overlay; run_guest;;
esac
