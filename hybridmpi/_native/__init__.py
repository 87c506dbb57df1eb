"""The native core: the C core (``_core``, built by cffi from ``cext/``), the CPython call
objects of the operations (``_calls``, ``cext/hm_calls*.c``), the one module that loads them
(:mod:`.clib`), the one error map (:mod:`.errmap`: every C return code, error record and error
bit becomes its exception there), the dtype and op tables (:mod:`.tables`) and the profile's
clock (:mod:`.marks`).  Nothing here imports the comm or the wings."""
