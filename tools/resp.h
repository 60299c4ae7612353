/* SPDX-License-Identifier: MIT */
/*
 * resp.h - parsing one RESP2 request out of a byte buffer.
 *
 * A request is either a multibulk array ("*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n",
 * what every client library sends) or an inline line ("PING hi\r\n", what a
 * person types into telnet). The parser is a pure function of the bytes: it
 * keeps no state between calls, allocates nothing and points the arguments
 * into the caller's buffer, so the server can parse in place and the fuzzer
 * can feed it anything (fuzz/fuzz_resp.c).
 *
 * Every size is bounded, and a request that would exceed a bound is refused
 * as soon as its header says so, before its bytes arrive: a client cannot
 * make the server buffer more than RESP_MAX_REQUEST bytes for one request.
 * Likewise a multibulk frame is refused as soon as a byte arrives that no
 * continuation could make valid (a header line ending in a bare LF, a
 * non-digit in a count, a payload not followed by CR LF): the client learns
 * why at once instead of waiting for bytes that will never come. Inline
 * lines may end in a bare LF.
 */
#ifndef TG_TOOLS_RESP_H
#define TG_TOOLS_RESP_H

#include <stddef.h>

/* Most arguments in one request (the command name included): TG.POLICY
 * with TG_RULES_MAX (16) rules of 8 arguments each (key, algorithm, limit,
 * period, BURST n, COST n) and its name. Clients' handshakes (HELLO,
 * CLIENT) take fewer than 10. */
#define RESP_MAX_ARGS 129
/* Longest single argument, in bytes. Keys are at most 256 bytes. */
#define RESP_MAX_BULK (16u * 1024u)
/* Longest whole request, framing included, in bytes; also the longest
 * inline line. */
#define RESP_MAX_REQUEST (64u * 1024u)
/* Longest "*N" or "$N" header line, CRLF included: a count has at most 20
 * characters, so a longer line is garbage, not a slow client. */
#define RESP_MAX_HEADER 32u

/* One argument: bytes inside the parsed buffer (not NUL-terminated). */
typedef struct resp_arg {
  const char *ptr;
  size_t len;
} resp_arg;

typedef enum resp_status {
  RESP_OK = 0,         /* a whole request: argc arguments, `used` bytes */
  RESP_INCOMPLETE = 1, /* not a whole request yet: wait for more bytes */
  RESP_PROTOCOL = -1,  /* garbage framing: answer `error`, then close */
  RESP_TOO_BIG = -2    /* a bound above is exceeded: answer, then close */
} resp_status;

/* The outcome of resp_parse. */
typedef struct resp_request {
  resp_arg argv[RESP_MAX_ARGS];
  size_t argc;       /* 0 for an empty request ("\r\n", "*0\r\n", "*-1\r\n"),
                        which is consumed and answers nothing, as in Redis */
  size_t used;       /* bytes of the buffer the request took (RESP_OK) */
  const char *error; /* static message for RESP_PROTOCOL / RESP_TOO_BIG */
} resp_request;

/* Parses the request at the start of buf[0..len). Returns a resp_status;
 * req->argc and req->used are meaningful only for RESP_OK, req->error only
 * for the negative statuses. Inline requests are split at spaces and tabs
 * (no quoting); an inline line that starts with no command is empty. */
resp_status resp_parse(const char *buf, size_t len, resp_request *req);

#endif
