#!/usr/bin/env bash
# Emulated hosts on one machine: N network namespaces joined by veth links to
# a bridge (in a switch namespace of its own), each host with its own address
# in a private range (an IPv4 one and, where the kernel has IPv6, an IPv6 one),
# its own sshd and host key, and a shaped link.
#
#   cluster.sh up N [--rate 1gbit] [--queue 50ms] [--delay 50us] [--jitter 0] [--name pst] [--subnet 10.77.0]
#   cluster.sh down [--name pst]
#   cluster.sh status [--name pst]
#   cluster.sh exec HOST CMD...             run CMD on host HOST (1..N)
#   cluster.sh launch [pstrain launch args] pstrain launch --launcher ssh from host 1
#                                           (--ipv6: over the hosts' IPv6 addresses;
#                                           --launcher mpi: Open MPI's mpirun over ssh,
#                                           with --ipv6 by names: see below; with
#                                           --mpirun mpirun.mpich, MPICH's, IPv4 only)
#   cluster.sh ssh-options                  the --ssh-option flags for the hosts
#   cluster.sh link HOST up|down            take a host's link down (a fault) or back up
#   cluster.sh kill HOST                    kill -9 every process on HOST but its sshd (a fault)
#   cluster.sh shape [--rate R] [--queue Q] [--delay D] [--jitter J]   reshape every link
#
# Every address lives inside the namespaces only: nothing is added to this
# machine's own network. Host i is SUBNET.(10+i) and fd0a:X:Y:1::(10+i) for
# --subnet 10.X.Y (hosts files: hosts, and hosts6 where IPv6 is up). The
# hosts have names too, seen by their sshd and by `exec` and `launch`: an
# /etc/hosts of the cluster's own, bind-mounted in a mount namespace, so
# that this machine's is not touched. NAME-hI is host I's IPv4 address (and
# its host name) and NAME-hI-v6 its IPv6 one alone; names6 lists those (Open
# MPI 4's mpirun takes names only, no IPv6 address). The
# state (hosts files, keys, sshd logs) is under
# /run/pstrain-cluster/NAME; `down` removes it with the namespaces, the links
# and every process in them, also after `up` failed half way.
#
# Shaping: the rate is a token bucket (tc tbf) on both ends of each host's
# link, so both directions are limited; --queue is how long a packet may wait
# in a link's queue before it is dropped (tbf's latency: 50 ms, 6 MB at 1
# Gbit/s, a deep switch port; 10 ms is a Linux host's 1000-packet queue at 1
# Gbit/s). Delay and jitter need the kernel's
# netem qdisc; on a kernel without it (`tc qdisc add ... netem` says "unknown")
# `up` says so and shapes the rate only.
#
# Needs root (network namespaces, veth links, tc).
set -euo pipefail

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

NAME=pst
SUBNET=10.77.0
RATE=1gbit
QUEUE=50ms
DELAY=50us
JITTER=0
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PSTRAIN=${PSTRAIN:-$ROOT/build/pstrain}

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  exit "${1:-0}"
}

# Options shared by the commands (after the command and its positional args).
parse_opts() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) NAME=${2:?--name needs a value}; shift 2 ;;
      --subnet) SUBNET=${2:?--subnet needs a value}; SUBNET_GIVEN=1; shift 2 ;;
      --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
      --queue) QUEUE=${2:?--queue needs a value}; shift 2 ;;
      --delay) DELAY=${2:?--delay needs a value}; shift 2 ;;
      --jitter) JITTER=${2:?--jitter needs a value}; shift 2 ;;
      -h | --help) usage 0 ;;
      *) die "unknown option '$1' (see cluster.sh --help)" ;;
    esac
  done
  [[ $NAME =~ ^[a-z][a-z0-9]{0,5}$ ]] ||
    die "--name '$NAME': 1-6 lower-case letters and digits, starting with a letter (interface names are short)"
  [[ $SUBNET =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    die "--subnet '$SUBNET': the first three octets of a 10.x.y.0/24 network, e.g. 10.77.0"
  STATE=/run/pstrain-cluster/$NAME
  # A running cluster's own subnet, unless this command names one (up).
  if [ -z "${SUBNET_GIVEN:-}" ] && [ -f "$STATE/subnet" ]; then SUBNET=$(cat "$STATE/subnet"); fi
}

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth links and tc): run it as root or with sudo"
  for tool in ip tc nsenter unshare ssh-keygen /usr/sbin/sshd; do
    command -v "$tool" >/dev/null ||
      die "'$tool' is missing: apt-get install iproute2 util-linux openssh-server openssh-client"
  done
}

host_ns() { echo "$NAME-h$1"; }

# Runs a command in network namespace $1. nsenter enters the network namespace
# only; `ip netns exec` and `ip -n` also remount /sys in a new mount namespace,
# which fails where / is not a mount point (a chroot, as in the fresh-machine
# check).
in_ns() {
  local ns=$1
  shift
  nsenter --net="/run/netns/$ns" -- "$@"
}
switch_ns() { echo "$NAME-sw"; }
host_addr() { echo "$SUBNET.$((10 + $1))"; }
# The IPv6 twin of host_addr (written as inet_ntop writes it: no "::" for one zero).
host_addr6() {
  local rest=${SUBNET#10.}
  echo "fd0a:${rest%%.*}:${rest#*.}:1::$((10 + $1))"
}

# Whether a process here can see an /etc/hosts of its own: "private" (a
# mount namespace whose mounts reach no other) or "no" (the hosts then have
# addresses but no names). In a chroot, where / is no mount point, unshare
# cannot make the namespace private, and a bind mount in one that is not
# could reach the file others see: "no" there.
names_mode() {
  if [ -f /etc/hosts ] && unshare --mount --propagation private true 2>/dev/null; then
    echo private
  else
    echo no
  fi
}

# Replaces this shell with a command run on host namespace $1, under the
# host's name (a UTS namespace of its own) and seeing the cluster's
# /etc/hosts (where names are "no", this machine's). The mount namespace is
# made inside the network one and lets go of its copy of /run/netns: that
# copy would keep every namespace mounted there (this cluster's and others')
# alive after `down` deletes it, as long as the process lives.
exec_on_host() {
  local ns=$1 mount=() bind=:
  shift
  if [ "$(cat "$STATE/names" 2>/dev/null)" = private ]; then
    mount=(--mount --propagation private)
    bind='mount --bind "$2" /etc/hosts && { umount -R -l /run/netns 2>/dev/null || true; }'
  fi
  exec nsenter --net="/run/netns/$ns" -- unshare --uts "${mount[@]}" sh -c \
    "hostname \"\$1\" && $bind && shift 2 && exec \"\$@\"" sh "$ns" "$STATE/etc_hosts" "$@"
}

# The hosts of a running cluster, from its state.
num_hosts() {
  [ -f "$STATE/size" ] || die "no cluster '$NAME' is up (no $STATE/size); run: cluster.sh up N"
  cat "$STATE/size"
}

# tc: rate both ways on host i's link; delay and jitter where netem exists.
shape_link() {
  local i=$1 sw ns dev side
  sw=$(switch_ns)
  for side in host switch; do
    if [ "$side" = host ]; then
      ns=$(host_ns "$i")
      dev=eth0
    else
      ns=$sw
      dev=h$i
    fi
    in_ns "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    if [ "$(cat "$STATE/netem")" = yes ]; then
      local jitter=()
      [ "$JITTER" != 0 ] && jitter=("$JITTER")
      in_ns "$ns" tc qdisc add dev "$dev" root netem rate "$RATE" delay "$DELAY" "${jitter[@]}" limit 100000
    else
      # A bucket of 1 ms at the rate (at least 64 KB: a segment offload), and
      # up to QUEUE queued before drops, like a switch port's buffer.
      in_ns "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst "$(burst_of "$RATE")" latency "$QUEUE"
    fi
  done
}

# Bytes a 1 ms burst carries at RATE (e.g. 1gbit -> 125000), at least 64 KiB.
burst_of() {
  local rate=$1 num unit bits
  num=${rate%%[a-zA-Z]*}
  unit=${rate#"$num"}
  case "$unit" in
    gbit) bits=$((num * 1000000000)) ;;
    mbit) bits=$((num * 1000000)) ;;
    kbit) bits=$((num * 1000)) ;;
    bit | "") bits=$num ;;
    *) die "--rate '$rate': use a number with gbit, mbit or kbit, e.g. 1gbit" ;;
  esac
  [[ $num =~ ^[0-9]+$ ]] || die "--rate '$rate': use a whole number with gbit, mbit or kbit, e.g. 10gbit"
  local b=$((bits / 8 / 1000))
  [ "$b" -lt 65536 ] && b=65536
  echo "$b"
}

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 60 ] || die "up N: N hosts, 1 to 60 (got '${n}')"
  shift
  parse_opts "$@"
  need_root
  burst_of "$RATE" >/dev/null
  if [ -d "$STATE" ] || ip netns list | grep "^$(switch_ns)\b" >/dev/null; then
    die "cluster '$NAME' is up already (or left over): run cluster.sh down --name $NAME first"
  fi
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  echo "$n" >"$STATE/size"
  echo "$SUBNET" >"$STATE/subnet"
  # A failure (or an interrupt) half way takes everything down again.
  trap 'echo "cluster.sh: up failed; taking down what it made" >&2; cmd_down --name "$NAME" >/dev/null 2>&1 || true' EXIT
  trap 'exit 130' INT TERM

  # Does this kernel have netem (delay, jitter)?
  ip netns add "$NAME-probe"
  in_ns "$NAME-probe" ip link add pa type veth peer name pb
  if in_ns "$NAME-probe" tc qdisc add dev pa root netem delay 1ms 2>/dev/null; then
    echo yes >"$STATE/netem"
  else
    echo no >"$STATE/netem"
    [ "$DELAY" != 0 ] || [ "$JITTER" != 0 ] &&
      echo "cluster.sh: this kernel has no netem qdisc (sch_netem): links get the rate ($RATE) but no added delay ($DELAY) or jitter ($JITTER)" >&2
  fi
  ip netns del "$NAME-probe"
  echo "$RATE $DELAY $JITTER $QUEUE" >"$STATE/shape"

  local sw
  sw=$(switch_ns)
  ip netns add "$sw"
  in_ns "$sw" ip link set lo up
  in_ns "$sw" ip link add br0 type bridge
  in_ns "$sw" ip link set br0 up

  ssh-keygen -q -t ed25519 -N "" -C "pstrain-cluster-$NAME" -f "$STATE/client_key"
  # ssh with the hosts' keys as one program, for launchers that take a
  # program and no options (MPICH's -launcher-exec).
  printf '#!/bin/sh\nexec ssh %s "$@"\n' "$(ssh_opts_plain)" >"$STATE/ssh"
  chmod 700 "$STATE/ssh"
  cp "$STATE/client_key.pub" "$STATE/authorized_keys"
  chmod 600 "$STATE/authorized_keys"
  : >"$STATE/known_hosts"
  : >"$STATE/hosts"
  local names
  names=$(names_mode)
  echo "$names" >"$STATE/names"
  cp /etc/hosts "$STATE/etc_hosts" 2>/dev/null || : >"$STATE/etc_hosts"
  [ -z "$(tail -c 1 "$STATE/etc_hosts")" ] || echo >>"$STATE/etc_hosts"
  echo "# pstrain cluster '$NAME'" >>"$STATE/etc_hosts"
  [ "$names" = no ] &&
    echo "cluster.sh: the hosts get no names here (no private mount namespace for an /etc/hosts of their own): mpirun over IPv6 needs them" >&2
  mkdir -p /run/sshd # sshd's privilege-separation directory

  local i ns addr addr6 v6=yes
  for i in $(seq 1 "$n"); do
    ns=$(host_ns "$i")
    addr=$(host_addr "$i")
    addr6=$(host_addr6 "$i")
    ip netns add "$ns"
    in_ns "$ns" ip link set lo up
    # Made inside the host, its peer moved to the switch: nothing in this
    # machine's own namespace, even for a moment.
    in_ns "$ns" ip link add eth0 type veth peer name "h$i" netns "$sw"
    in_ns "$ns" ip addr add "$addr/24" dev eth0
    # IPv6 where the kernel has it (nodad: usable at once, no duplicate
    # address detection on a link that is ours alone).
    if [ "$v6" = yes ] && ! in_ns "$ns" ip -6 addr add "$addr6/64" dev eth0 nodad 2>/dev/null; then
      v6=no
      echo "cluster.sh: no IPv6 here (ip -6 addr add failed): the hosts get IPv4 addresses only" >&2
    fi
    in_ns "$ns" ip link set eth0 up
    in_ns "$sw" ip link set "h$i" master br0
    in_ns "$sw" ip link set "h$i" up
    shape_link "$i"

    ssh-keygen -q -t ed25519 -N "" -C "$ns" -f "$STATE/h$i.hostkey"
    cat >"$STATE/h$i.sshd_config" <<EOF
ListenAddress $addr:22
$([ "$v6" = yes ] && echo "ListenAddress [$addr6]:22")
HostKey $STATE/h$i.hostkey
PidFile $STATE/h$i.sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 200
MaxSessions 200
ClientAliveInterval 5
ClientAliveCountMax 3
AcceptEnv LANG LC_*
EOF
    echo "$addr $ns" >>"$STATE/etc_hosts"
    [ "$v6" = yes ] && echo "$addr6 $ns-v6" >>"$STATE/etc_hosts"
    # Its own host name too: what its processes report; and the hosts'
    # names, for the logins it serves.
    (exec_on_host "$ns" /usr/sbin/sshd -f "$STATE/h$i.sshd_config" -E "$STATE/h$i.sshd.log")
    echo "$addr,$addr6,$ns,$ns-v6 $(cut -d' ' -f1,2 "$STATE/h$i.hostkey.pub")" >>"$STATE/known_hosts"
    echo "$addr" >>"$STATE/hosts"
    echo "[$addr6]" >>"$STATE/hosts6"
    echo "$ns-v6" >>"$STATE/names6"
  done
  echo "$v6" >"$STATE/ipv6"
  [ "$v6" = yes ] || rm -f "$STATE/hosts6" "$STATE/names6"
  [ "$names" != no ] || rm -f "$STATE/names6"

  # Ready when every host answers a real ssh login from host 1.
  for i in $(seq 1 "$n"); do
    local ok=
    for _ in $(seq 1 100); do
      # shellcheck disable=SC2046  # ssh_opts_plain is words
      if in_ns "$(host_ns 1)" ssh -T $(ssh_opts_plain) "$(host_addr "$i")" true 2>/dev/null &&
        { [ "$v6" = no ] || in_ns "$(host_ns 1)" ssh -T $(ssh_opts_plain) "$(host_addr6 "$i")" true 2>/dev/null; }; then
        ok=1
        break
      fi
      sleep 0.1
    done
    [ -n "$ok" ] || die "host $i ($(host_addr "$i")$([ "$v6" = yes ] && echo ", $(host_addr6 "$i")")) does not answer ssh: $(tail -3 "$STATE/h$i.sshd.log" 2>/dev/null)"
  done
  trap - EXIT INT TERM
  echo "cluster '$NAME' up: $n hosts $(host_addr 1)..$(host_addr "$n")$([ "$v6" = yes ] && echo " and $(host_addr6 1)..$(host_addr6 "$n")"), links $RATE$([ "$(cat "$STATE/netem")" = yes ] && echo ", delay $DELAY, jitter $JITTER" || echo " (no netem: no delay)")"
  echo "hosts file: $STATE/hosts$([ "$v6" = yes ] && echo " (IPv6: $STATE/hosts6)"); launch with: bench/cluster/cluster.sh launch [--ipv6] -n W -s S -- COMMAND"
}

ssh_opts_plain() {
  echo "-o BatchMode=yes -o IdentitiesOnly=yes -o IdentityFile=$STATE/client_key -o UserKnownHostsFile=$STATE/known_hosts -o StrictHostKeyChecking=yes"
}

cmd_ssh_options() {
  parse_opts "$@"
  num_hosts >/dev/null
  echo "--ssh-option IdentityFile=$STATE/client_key --ssh-option IdentitiesOnly=yes --ssh-option UserKnownHostsFile=$STATE/known_hosts --ssh-option StrictHostKeyChecking=yes"
}

cmd_down() {
  parse_opts "$@"
  need_root
  local ns pid pids
  # Every namespace of this cluster, listed or not in the state (a crash of up).
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$NAME-(h[0-9]+|sw|probe)$" || true); do
    # The processes in it are ours (sshd, the jobs it ran): end them by PID.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    for _ in $(seq 1 50); do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -z "$pids" ] && break
      sleep 0.1
    done
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns"
  done
  rm -rf "$STATE"
  rmdir /run/pstrain-cluster 2>/dev/null || true
  echo "cluster '$NAME' down"
}

cmd_status() {
  parse_opts "$@"
  need_root
  if [ ! -f "$STATE/size" ]; then
    local left
    left=$(ip netns list | awk '{print $1}' | grep -E "^$NAME-(h[0-9]+|sw|probe)$" | tr '\n' ' ' || true)
    if [ -n "$left" ]; then
      echo "cluster '$NAME': not up, but namespaces are left over: $left(run cluster.sh down --name $NAME)"
      return 1
    fi
    echo "cluster '$NAME': down"
    return 3
  fi
  local n i ns state pid sshd
  n=$(num_hosts)
  echo "cluster '$NAME': $n hosts, links $(cat "$STATE/shape") (rate delay jitter queue; netem: $(cat "$STATE/netem"))"
  printf '%-6s %-12s %-10s %-6s %-8s %s\n' host address namespace link sshd qdisc
  for i in $(seq 1 "$n"); do
    ns=$(host_ns "$i")
    state=$(in_ns "$ns" ip -br link show eth0 2>/dev/null | awk '{print $2}' || echo missing)
    pid=$(cat "$STATE/h$i.sshd.pid" 2>/dev/null || true)
    sshd=down
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && sshd=$pid
    printf '%-6s %-12s %-10s %-6s %-8s %s\n' "h$i" "$(host_addr "$i")" "$ns" "${state:-missing}" "$sshd" \
      "$(in_ns "$ns" tc qdisc show dev eth0 2>/dev/null | head -1 | cut -d' ' -f2,7-12)"
  done
}

cmd_exec() {
  local i=${1:-}
  shift || true
  STATE=/run/pstrain-cluster/$NAME
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$(num_hosts)" ] ||
    die "exec HOST CMD: HOST is 1..$(num_hosts) (got '$i')"
  [ $# -gt 0 ] || die "exec HOST CMD: no command"
  exec_on_host "$(host_ns "$i")" "$@"
}

cmd_launch() {
  STATE=/run/pstrain-cluster/$NAME
  num_hosts >/dev/null
  [ -x "$PSTRAIN" ] || die "$PSTRAIN is not built (set PSTRAIN=/path/to/pstrain)"
  # --ipv6 (before the command's --) is ours; the rest goes to pstrain launch.
  local hosts=$STATE/hosts args=() rest='' a prev='' mpi='' v6=''
  for a in "$@"; do
    if [ -z "$rest" ] && [ "$a" = --ipv6 ]; then
      [ -f "$STATE/hosts6" ] || die "launch --ipv6: cluster '$NAME' has no IPv6 addresses (see cluster.sh up's output)"
      hosts=$STATE/hosts6
      v6=1
      continue
    fi
    [ "$a" = -- ] && rest=1
    args+=("$a")
  done
  set -- ${args[@]+"${args[@]}"}
  for a in "$@"; do
    [ "$a" = -- ] && break
    case "$prev $a" in
      "--launcher mpi" | "--launcher mpirun" | "--cluster mpi" | "--cluster mpirun") mpi=1 ;;
      *" --launcher=mpi" | *" --launcher=mpirun" | *" --cluster=mpi" | *" --cluster=mpirun") mpi=1 ;;
    esac
    prev=$a
  done
  if [ -n "$mpi" ]; then
    local mpirun=mpirun
    prev=''
    for a in "$@"; do
      [ "$a" = -- ] && break
      [ "$prev" = --mpirun ] && mpirun=$a
      case "$a" in --mpirun=*) mpirun=${a#--mpirun=} ;; esac
      prev=$a
    done
    # Not `mpirun --version | grep -q`: grep's early exit can kill mpirun
    # with SIGPIPE mid-output, and pipefail then reads it as no match.
    local version
    version=$("$mpirun" --version 2>&1 || true)
    if grep -qi -e mpich -e hydra <<<"$version"; then
      # MPICH's Hydra: ssh through a program with the hosts' keys; its
      # proxies reach mpiexec at host 1's name, over IPv4 only.
      [ -z "$v6" ] || die "launch --ipv6 --launcher mpi: MPICH's Hydra reaches its proxies over IPv4 only"
      [ "$(cat "$STATE/names")" = private ] || die "launch --launcher mpi with MPICH: Hydra's proxies reach mpiexec by host 1's name, and the hosts of cluster '$NAME' have no names (see cluster.sh up's output)"
      [ -x "$STATE/ssh" ] || die "launch --launcher mpi with MPICH: cluster '$NAME' has no ssh wrapper ($STATE/ssh; it was made by an older cluster.sh): run down and up again"
      exec_on_host "$(host_ns 1)" "$PSTRAIN" launch -H "$hosts" --mpi-option -launcher \
        --mpi-option ssh --mpi-option -launcher-exec --mpi-option "$STATE/ssh" "$@"
    fi
    # Open MPI 4's mpirun takes host names, no IPv6 address: by the names
    # that resolve to the hosts' IPv6 addresses alone.
    if [ -n "$v6" ]; then
      [ -f "$STATE/names6" ] || die "launch --ipv6 --launcher mpi: the hosts of cluster '$NAME' have no names (see cluster.sh up's output), and Open MPI's mpirun takes no IPv6 address"
      hosts=$STATE/names6
    fi
    # Open MPI's mpirun starts its daemons over ssh with the hosts' keys; the
    # emulated hosts share this machine's cores, so ranks may outnumber them.
    local root=()
    [ "$(id -u)" = 0 ] && root=(--mpi-option --allow-run-as-root)
    exec_on_host "$(host_ns 1)" "$PSTRAIN" launch -H "$hosts" \
      --mpi-option --mca --mpi-option plm_rsh_args --mpi-option "$(ssh_opts_plain)" \
      --mpi-option --oversubscribe "${root[@]}" "$@"
  fi
  # shellcheck disable=SC2046
  exec_on_host "$(host_ns 1)" "$PSTRAIN" launch --launcher ssh -H "$hosts" \
    $(cmd_ssh_options --name "$NAME") "$@"
}

cmd_link() {
  local i=${1:-} updown=${2:-}
  shift 2 || true
  parse_opts "$@"
  need_root
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$(num_hosts)" ] ||
    die "link HOST up|down: HOST is 1..$(num_hosts) (got '$i')"
  [ "$updown" = up ] || [ "$updown" = down ] || die "link HOST up|down (got '$updown')"
  in_ns "$(host_ns "$i")" ip link set eth0 "$updown"
}

cmd_kill() {
  local i=${1:-}
  shift || true
  parse_opts "$@"
  need_root
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$(num_hosts)" ] ||
    die "kill HOST: HOST is 1..$(num_hosts) (got '$i')"
  local sshd pids=() pid
  sshd=$(cat "$STATE/h$i.sshd.pid" 2>/dev/null || true)
  for pid in $(ip netns pids "$(host_ns "$i")"); do
    [ "$pid" = "$sshd" ] || pids+=("$pid")
  done
  [ ${#pids[@]} -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
  echo "killed ${#pids[@]} processes on host $i"
}

cmd_shape() {
  parse_opts "$@"
  need_root
  burst_of "$RATE" >/dev/null
  local i
  for i in $(seq 1 "$(num_hosts)"); do shape_link "$i"; done
  echo "$RATE $DELAY $JITTER $QUEUE" >"$STATE/shape"
  echo "links now $RATE, queue $QUEUE$([ "$(cat "$STATE/netem")" = yes ] && echo ", delay $DELAY, jitter $JITTER")"
}

[ $# -ge 1 ] || usage 2
cmd=$1
shift
# exec and launch pass their arguments on: --name only from the environment.
NAME=${PSTRAIN_CLUSTER_NAME:-$NAME}
case "$cmd" in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  status) cmd_status "$@" ;;
  exec) cmd_exec "$@" ;;
  launch) cmd_launch "$@" ;;
  ssh-options) cmd_ssh_options "$@" ;;
  link) cmd_link "$@" ;;
  kill) cmd_kill "$@" ;;
  shape) cmd_shape "$@" ;;
  -h | --help | help) usage 0 ;;
  *) die "unknown command '$cmd' (up, down, status, exec, launch, ssh-options, link, kill, shape)" ;;
esac
