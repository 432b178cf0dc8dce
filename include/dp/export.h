/* dp/export.h - symbol visibility for the public API. */
#ifndef DP_EXPORT_H
#define DP_EXPORT_H

#if defined(_WIN32)
#define DP_API
#elif defined(__GNUC__) || defined(__clang__)
#define DP_API __attribute__((visibility("default")))
#else
#define DP_API
#endif

#endif /* DP_EXPORT_H */
