#!/bin/sh
# mpi_bundle.sh - a relocatable copy of this machine's Debian OpenMPI runtime for a GPU machine
# that has none (`make carry-mpi`): the device machines run Ubuntu without OpenMPI and without
# network access, so `mpirun -np 1 qshard ...` (the multi-process path at world size 1, README
# "Several processes (MPI)") can only run there with OpenMPI carried along. Only for testing:
# users install OpenMPI from their distribution (apt-get install openmpi-bin libopenmpi-dev).
#
#   sh tools/mpi_bundle.sh DIR
#
# DIR gets the OpenMPI prefix layout Debian 12 uses (bin/, lib/x86_64-linux-gnu/openmpi/lib/
# openmpi3/ components but those for InfiniBand / UCX / libfabric, share/openmpi help texts,
# PMIx's own components), the shared libraries in DIR/lib, and DIR/with-mpi, which runs a
# command with it (PATH, LD_LIBRARY_PATH, OPAL_PREFIX, PMIX_PREFIX):
#   DIR/with-mpi mpirun -np 1 build-dev/qshard-mpi run MODEL ...
# Needs openmpi-bin and libopenmpi3 (Debian 12: OpenMPI 4.1, PMIx 4).
set -eu
D=${1:?usage: sh tools/mpi_bundle.sh DIR}
A=/usr/lib/x86_64-linux-gnu
test -x /usr/bin/orterun || { echo "mpi_bundle: /usr/bin/orterun missing (apt-get install openmpi-bin)"; exit 1; }
test -d $A/openmpi/lib/openmpi3 || { echo "mpi_bundle: $A/openmpi/lib/openmpi3 missing"; exit 1; }
rm -rf "$D"
mkdir -p "$D/bin" "$D/lib" "$D/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" "$D/share" \
    "$D/pmix/lib/pmix" "$D/pmix/share"
cp -L /usr/bin/orterun /usr/bin/orted "$D/bin/"
ln -s orterun "$D/bin/mpirun"
# components: all but those for fabrics a one-node test does not have (their libraries are not
# carried, and a component that cannot load is skipped with a warning)
for f in $A/openmpi/lib/openmpi3/*.so; do
    case $(basename "$f") in
    *ucx* | *ofi* | *openib* | *psm* | *netlink* | *verbs* | *java*) continue ;;
    esac
    cp -L "$f" "$D/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/"
done
cp -L $A/pmix2/lib/pmix/*.so "$D/pmix/lib/pmix/" 2>/dev/null || true
cp -r $A/pmix2/share/. "$D/pmix/share/" 2>/dev/null || true
cp -r /usr/share/openmpi "$D/share/"
# shared libraries: what the programs and components above need, from the MPI packages only
# (glibc, zlib, libudev... are on every machine)
libs=$( (ldd "$D/bin/orterun" "$D/bin/orted" "$D"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
    $A/libmpi.so.40 2>/dev/null) | awk '/=>/ {print $3}' | sort -u |
    grep -E 'libmpi|libopen-(rte|pal)|libmca_common|libhwloc|libevent|libpmix|libmunge|libltdl' || true)
for l in $libs $A/libmpi.so.40; do cp -L "$l" "$D/lib/"; done
strip --strip-unneeded "$D"/bin/* "$D"/lib/*.so* "$D"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so \
    2>/dev/null || true
cat > "$D/with-mpi" <<'EOF'
#!/bin/sh
# with-mpi COMMAND...: run COMMAND with the carried OpenMPI (tools/mpi_bundle.sh) first in PATH
# and in the loader path
B=$(cd "$(dirname "$0")" && pwd)
export PATH="$B/bin:$PATH" LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$B" PMIX_PREFIX="$B/pmix"
export OMPI_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_mca_base_component_path="$B/pmix/lib/pmix"
exec "$@"
EOF
chmod +x "$D/with-mpi"
echo "mpi_bundle: $(du -sh "$D" | cut -f1) in $D ($D/with-mpi mpirun -np N ...)"
