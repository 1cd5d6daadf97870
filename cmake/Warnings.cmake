# Warning and sanitizer flags applied to every cxltier target.
add_compile_options(-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
                    -Wimplicit-fallthrough)
if(CXLTIER_WERROR)
  add_compile_options(-Werror)
endif()

if(CXLTIER_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
elseif(CXLTIER_SANITIZE STREQUAL "thread")
  # -Wno-tsan: Asio uses atomic_thread_fence, which GCC warns TSan cannot see.
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer -Wno-tsan)
  add_link_options(-fsanitize=thread)
elseif(CXLTIER_SANITIZE STREQUAL "fuzzer")
  # libFuzzer (clang only): everything instrumented, tests/fuzz adds the fuzzers.
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "CXLTIER_SANITIZE=fuzzer needs clang: CXX=clang++ (apt-get install clang)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
elseif(NOT CXLTIER_SANITIZE STREQUAL "")
  message(FATAL_ERROR "CXLTIER_SANITIZE must be empty, 'address', 'thread' or 'fuzzer', not '${CXLTIER_SANITIZE}'")
endif()
