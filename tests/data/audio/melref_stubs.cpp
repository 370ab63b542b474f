#include <cstdio>
#include <cstdlib>
#include "clip-impl.h"
extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
struct clip_logger_state g_logger_state = {clip_log_callback_default, NULL};
