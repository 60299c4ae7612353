/*
 * store.h - the internal interface between the limiter and where key state
 * lives.
 *
 * The limiter validates input and prepares the quota; a store executes the
 * call. Stores that hold state locally run the pure steps of src/core on it
 * (so the arithmetic is written once); a remote store may run the same
 * arithmetic elsewhere, as long as the answers are identical.
 */
#ifndef TG_STORE_H
#define TG_STORE_H

#include "../core/core.h"

typedef struct tg__store tg__store;

typedef struct tg__store_ops {
  /* Executes one validated call (op supported, quota prepared, now in
   * range). Returns 0 or a TG_E* code; on 0, *o holds the answer. */
  int (*exec)(tg__store *s, const tg__call *c, tg__outcome *o);
  /* Deletes the key's state; absent keys are not an error. */
  int (*reset)(tg__store *s, const void *key, size_t key_len);
  /* Keys currently holding state. */
  size_t (*key_count)(const tg__store *s);
  /* Frees everything. */
  void (*destroy)(tg__store *s);
} tg__store_ops;

/* Every store starts with this, so a tg__store * can point at any of them. */
struct tg__store {
  const tg__store_ops *ops;
};

/* The single-threaded in-process store (store/simple.c). sliding_max caps
 * each sliding log (tg_config.sliding_max_entries). */
int tg__simple_store_new(tg__store **out, uint32_t sliding_max);

#endif /* TG_STORE_H */
