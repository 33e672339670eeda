;; A valid WebAssembly module with a memory and nothing an NRI plugin must
;; export: loading it fails, naming the first missing export.
(module
  (memory (export "memory") 1)
  (func (export "_initialize")))
