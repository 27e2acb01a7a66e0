# CPACK_PROJECT_CONFIG_FILE: refuses to package a build made with SPDL_TEST_HOOKS (its spdld and
# client carry the test seams). tests/ops/package.sh checks the packaging of the test build and says
# so with SPDL_PACKAGE_TEST_BUILD=1; a package to ship comes from a -DSPDL_TEST_HOOKS=OFF build.
if(CPACK_SPDL_TEST_HOOKS AND NOT "$ENV{SPDL_PACKAGE_TEST_BUILD}" STREQUAL "1")
  message(FATAL_ERROR "this build has SPDL_TEST_HOOKS=ON (test seams in spdld and the client): configure "
                      "with -DCMAKE_BUILD_TYPE=Release -DSPDL_TEST_HOOKS=OFF to make a package")
endif()
