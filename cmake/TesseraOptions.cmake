# All build options of tessera, in one place.
#
# TESSERA_WITH_RDMA / TESSERA_WITH_CUDA take AUTO|ON|OFF:
#   AUTO: use the feature when its dependency is found, otherwise build the stub;
#   ON:   fail the configure step when the dependency is missing;
#   OFF:  always build the stub (operations return TS_ENOTSUP).
set(TESSERA_WITH_RDMA AUTO CACHE STRING "RDMA transport via rdma-core (AUTO|ON|OFF)")
set_property(CACHE TESSERA_WITH_RDMA PROPERTY STRINGS AUTO ON OFF)
set(TESSERA_WITH_CUDA AUTO CACHE STRING "GPU memory targets via the CUDA toolkit (AUTO|ON|OFF)")
set_property(CACHE TESSERA_WITH_CUDA PROPERTY STRINGS AUTO ON OFF)
set(TESSERA_SANITIZE "" CACHE STRING
  "Build with sanitizers: address, undefined or both as address,undefined, or thread (empty: none)")
set_property(CACHE TESSERA_SANITIZE PROPERTY STRINGS "" address undefined "address,undefined" thread)
option(TESSERA_BUILD_TESTS "Build the cmocka unit and integration tests" ON)
option(TESSERA_WERROR "Treat compiler warnings as errors" ON)

foreach(opt TESSERA_WITH_RDMA TESSERA_WITH_CUDA)
  if(NOT ${opt} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt} must be AUTO, ON or OFF (got '${${opt}}')")
  endif()
endforeach()
if(TESSERA_SANITIZE AND NOT TESSERA_SANITIZE MATCHES "^((address|undefined)(,(address|undefined))*|thread)$")
  message(FATAL_ERROR "TESSERA_SANITIZE must be address, undefined, address,undefined or thread "
                      "(got '${TESSERA_SANITIZE}')")
endif()
