"""cc_toolchain_config for Debian's clang-14 building libFuzzer targets with ASan and UBSan.

Every object (abseil, RE2, the core, the fuzz target) is instrumented for
coverage (-fsanitize=fuzzer-no-link) and for address and undefined-behaviour
errors; only the final link adds libFuzzer's main (-fsanitize=fuzzer).
Selected by tools/fuzz/fuzz.bzl's transition, never by the command line, so
these objects live in their own configuration directory and the main build's
cache is untouched.
"""

load("//tools:cc_toolchain_common.bzl", "COMPILE_ACTIONS", "CXX_ACTIONS", "LINK_ACTIONS", "flags")
load("@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl", "feature", "tool_path")

_SANITIZERS = "-fsanitize=address,undefined"

def _impl(ctx):
    tool_paths = [
        tool_path(name = "gcc", path = "/usr/bin/clang-14"),
        tool_path(name = "ld", path = "/usr/bin/ld"),
        tool_path(name = "ar", path = "/usr/bin/ar"),
        tool_path(name = "cpp", path = "/usr/bin/clang-cpp-14"),
        tool_path(name = "gcov", path = "/bin/false"),
        tool_path(name = "nm", path = "/usr/bin/nm"),
        tool_path(name = "objcopy", path = "/usr/bin/objcopy"),
        tool_path(name = "objdump", path = "/usr/bin/objdump"),
        tool_path(name = "strip", path = "/usr/bin/strip"),
    ]
    features = [
        feature(name = "dbg"),
        feature(name = "opt"),
        feature(name = "fastbuild"),
        feature(name = "supports_pic", enabled = True),
        feature(
            name = "default_compile_flags",
            enabled = True,
            flag_sets = [
                flags(COMPILE_ACTIONS, [
                    "-O1",
                    "-g",
                    "-fno-omit-frame-pointer",
                    _SANITIZERS,
                    "-fsanitize=fuzzer-no-link",
                    # A UBSan finding is a crash, not a log line.
                    "-fno-sanitize-recover=all",
                    "-Wno-unused-command-line-argument",
                    "-Wno-deprecated-declarations",
                    # The same bytes on every machine and run.
                    "-Wno-builtin-macro-redefined",
                    "-D__DATE__=\"redacted\"",
                    "-D__TIMESTAMP__=\"redacted\"",
                    "-D__TIME__=\"redacted\"",
                ]),
                flags(CXX_ACTIONS, ["-std=c++17"]),
            ],
        ),
        feature(
            name = "default_link_flags",
            enabled = True,
            flag_sets = [
                flags(LINK_ACTIONS, [
                    "-fuse-ld=bfd",
                    _SANITIZERS,
                    "-fsanitize=fuzzer",
                    # The driver is clang (not clang++): link UBSan's C++ part too.
                    "-fsanitize-link-c++-runtime",
                    "-lstdc++",
                    "-lm",
                    "-lpthread",
                ]),
            ],
        ),
    ]
    return cc_common.create_cc_toolchain_config_info(
        ctx = ctx,
        features = features,
        cxx_builtin_include_directories = ctx.attr.builtin_include_directories,
        toolchain_identifier = "clang14-libfuzzer",
        host_system_name = "x86_64-unknown-linux-gnu",
        target_system_name = "x86_64-unknown-linux-gnu",
        target_cpu = "k8",
        target_libc = "glibc",
        compiler = "clang",
        abi_version = "local",
        abi_libc_version = "local",
        tool_paths = tool_paths,
    )

fuzz_cc_toolchain_config = rule(
    implementation = _impl,
    attrs = {"builtin_include_directories": attr.string_list()},
    provides = [CcToolchainConfigInfo],
)
