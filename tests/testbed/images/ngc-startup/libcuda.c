/* TEST DOUBLE of libcuda.so.1, built twice into the testbed's NGC stand-in: the image's own user-mode
 * driver in /usr/local/cuda/compat/lib.real (KIND "compat") and the host's, which the container
 * toolkit mounts into a system library folder on a Spark (KIND "host"). Both carry the soname
 * libcuda.so.1, so the dynamic loader picks one exactly as it would on a Spark: LD_LIBRARY_PATH first,
 * then ld.so.cache. The engine stand-in (gb10-platform) loads it by soname and asks which it got. */
const char *sparkcluster_standin_libcuda(void) { return KIND; }
