# Finds every dependency once and exposes it as an imported target (tessera::X).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenSSL 3.0 REQUIRED)

pkg_check_modules(LIBEVENT REQUIRED IMPORTED_TARGET libevent_core libevent_extra libevent_pthreads
  libevent_openssl)
pkg_check_modules(JSONC REQUIRED IMPORTED_TARGET json-c)
pkg_check_modules(LIBCONFIG REQUIRED IMPORTED_TARGET libconfig)

# cmocka: only the tests (TESSERA_BUILD_TESTS, on by default) link it.
if(TESSERA_BUILD_TESTS)
  pkg_check_modules(CMOCKA IMPORTED_TARGET GLOBAL cmocka)
  if(NOT CMOCKA_FOUND)
    message(FATAL_ERROR "cmocka not found: install libcmocka-dev (scripts/deps does), or "
                        "configure with -DTESSERA_BUILD_TESTS=OFF (scripts/quickstart does)")
  endif()
endif()

find_path(ROCKSDB_INCLUDE_DIR rocksdb/c.h)
find_library(ROCKSDB_LIBRARY NAMES rocksdb)
if(NOT ROCKSDB_INCLUDE_DIR OR NOT ROCKSDB_LIBRARY)
  message(FATAL_ERROR "RocksDB not found: install librocksdb-dev (scripts/deps does)")
endif()
add_library(tessera::rocksdb UNKNOWN IMPORTED)
set_target_properties(tessera::rocksdb PROPERTIES IMPORTED_LOCATION ${ROCKSDB_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${ROCKSDB_INCLUDE_DIR})

find_path(ISAL_INCLUDE_DIR isa-l/crc.h)
find_library(ISAL_LIBRARY NAMES isal)
if(NOT ISAL_INCLUDE_DIR OR NOT ISAL_LIBRARY)
  message(FATAL_ERROR "ISA-L not found: install libisal-dev (scripts/deps does)")
endif()
add_library(tessera::isal UNKNOWN IMPORTED)
set_target_properties(tessera::isal PROPERTIES IMPORTED_LOCATION ${ISAL_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${ISAL_INCLUDE_DIR})

# RDMA: rdma-core's libibverbs + librdmacm.
set(TESSERA_HAVE_RDMA OFF)
if(NOT TESSERA_WITH_RDMA STREQUAL "OFF")
  find_path(IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  find_library(IBVERBS_LIBRARY ibverbs)
  find_path(RDMACM_INCLUDE_DIR rdma/rdma_cma.h)
  find_library(RDMACM_LIBRARY rdmacm)
  if(IBVERBS_INCLUDE_DIR AND IBVERBS_LIBRARY AND RDMACM_INCLUDE_DIR AND RDMACM_LIBRARY)
    set(TESSERA_HAVE_RDMA ON)
    add_library(tessera::rdma INTERFACE IMPORTED)
    set_target_properties(tessera::rdma PROPERTIES
      INTERFACE_LINK_LIBRARIES "${RDMACM_LIBRARY};${IBVERBS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${IBVERBS_INCLUDE_DIR};${RDMACM_INCLUDE_DIR}")
  elseif(TESSERA_WITH_RDMA STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_WITH_RDMA=ON but rdma-core was not found "
                        "(install libibverbs-dev librdmacm-dev)")
  endif()
endif()
if(TESSERA_HAVE_RDMA)
  set(TESSERA_RDMA_SUMMARY "yes (${IBVERBS_LIBRARY}, ${RDMACM_LIBRARY})")
else()
  set(TESSERA_RDMA_SUMMARY "no (stub returning TS_ENOTSUP; TESSERA_WITH_RDMA=${TESSERA_WITH_RDMA})")
endif()

# CUDA: the toolkit at /usr/local/cuda or wherever CUDAToolkit finds it.
set(TESSERA_HAVE_CUDA OFF)
if(NOT TESSERA_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(TESSERA_HAVE_CUDA ON)
  elseif(TESSERA_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TESSERA_WITH_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
if(TESSERA_HAVE_CUDA)
  set(TESSERA_CUDA_SUMMARY "yes (CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR})")
else()
  set(TESSERA_CUDA_SUMMARY "no (stub returning TS_ENOTSUP; TESSERA_WITH_CUDA=${TESSERA_WITH_CUDA})")
endif()
