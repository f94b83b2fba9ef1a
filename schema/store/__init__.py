"""All SQL of the project, split by concern. Each public function is one transaction
(through ``tx.run_transaction``) around an inner ``_txn(conn, ...)`` that never commits."""
