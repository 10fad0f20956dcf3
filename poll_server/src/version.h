/* version.h -- the one place the poll server's version lives. */
#ifndef FP_VERSION_H
#define FP_VERSION_H

#define FP_VERSION "0.1.0"

#endif
